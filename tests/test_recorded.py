"""Unwinding and symbolization replayed from recordings of real runs
(tests/fixtures/, made by make_recordings.py): no root, no kernel, no
probes. chain.c built -O2 -fomit-frame-pointer, so only DWARF CFI gives the
full stack main -> a -> b -> c -> d.

libc is the system's: its frames are named only when this machine's libc
has the recorded build-id (the same Debian 12 image); elsewhere the libc
part is skipped with the reason, and the frames inside chain still count."""
from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from ustack.recording import format as rf
from ustack.capture.stream import Stream
from ustack.recording.reader import RecordedCapture
from ustack.model import (CommEvent, ExitEvent, ForkEvent, Losses, Mapping,
                          MmapEvent, Piece, RawSample, UnwoundSample, UstackError,
                          unwound_sample)
from ustack.objfile.elf import ElfImage
from ustack.recording.writer import RecordWriter
from ustack.session import Session
from ustack.symbols.stacks import StackResolver
from ustack.target.mappings import MappingTracker
from helpers import FIXTURES, rebuilt_copy

CALLS = 24                           # make_recordings.CALLS: d's calls in each run
CHAIN = ["d", "c", "b", "a", "main"]
LIBC_START = ["__libc_start_call_main", "__libc_start_main"]


def replay(name: str, objects=(FIXTURES,)):
    return Session.replay(FIXTURES / name, objects=objects)


def functions(stack) -> list:
    return [f.function for f in stack.frames]


def skip_unless_libc_matches(session) -> None:
    """Skip (saying why) when this machine's libc is not the recorded one."""
    refused = [w for w in session.capture.warnings if "libc.so" in w]
    if refused:
        pytest.skip(f"system libc differs from the recording's: {refused[0]}")


# -- DWARF samples of a binary without frame pointers ----------------------------

def test_trace_names_the_chain_inside_the_binary():
    with replay("trace-d-dwarf.ustack") as session:
        events = list(session.events())
    assert len(events) == CALLS
    for event in events:
        assert event.label.startswith("uprobe:") and event.label.endswith("/chain:d")
        assert event.comm == "chain"
        chain = event.stack.frames[:5]
        assert [f.function for f in chain] == CHAIN
        assert {f.module for f in chain} == {"chain"}
        assert event.stack.notes == ()


def test_trace_names_libc_frames_when_libc_is_the_recorded_one():
    with replay("trace-d-dwarf.ustack") as session:
        events = list(session.events())
        skip_unless_libc_matches(session)
    for event in events:
        assert functions(event.stack) == CHAIN + LIBC_START + ["_start"]
        assert [f.module for f in event.stack.frames[5:]] == \
            ["libc.so.6", "libc.so.6", "chain"]


def test_count_of_write_through_libc():
    with replay("count-write-dwarf.ustack") as session:
        counts = session.counts()
        skip_unless_libc_matches(session)
    assert len(counts) == 1
    (counted,) = counts
    assert counted.count == CALLS
    assert counted.event == "syscall:write"
    assert counted.comm == "chain"
    assert functions(counted.stack) == ["write"] + CHAIN + LIBC_START + ["_start"]
    assert session.capture.losses() == Losses()


# -- frame pointers ----------------------------------------------------------------

def test_count_of_frame_pointer_stacks():
    """The kernel's frame-pointer walk ends in libc (no frame pointers
    there): the same in the replay as in the run."""
    with replay("count-d-fp.ustack") as session:
        counts = session.counts()
    assert [c.count for c in counts] == [CALLS]
    names = functions(counts[0].stack)
    assert names[:5] == CHAIN
    assert [f.module for f in counts[0].stack.frames[:5]] == ["chain"] * 5
    assert len(names) == 6                   # + the caller of main, in libc
    assert counts[0].stack.frames[5].module == "libc.so.6"
    skip_unless_libc_matches(session)
    assert names[5] == LIBC_START[0]


# -- the stream itself, without a Session ------------------------------------------------

def test_stream_and_stack_resolver_over_a_recorded_capture():
    capture = RecordedCapture(FIXTURES / "trace-d-dwarf.ustack", objects=[FIXTURES])
    capture.open()
    assert capture.modes == ("dwarf",)
    tracker = MappingTracker(live=False)
    resolver = StackResolver(tracker)
    stream = Stream(capture)
    stream.start()
    stacks = []
    for piece in stream.rest():
        for event in piece.metas:
            tracker.apply(event)
        stacks += [functions(resolver.stack(s))[:5] for s in piece.samples]
    capture.close()
    assert stacks == [CHAIN] * CALLS


# -- what is refused ---------------------------------------------------------------


def test_a_rebuilt_binary_is_refused(tmp_path):
    copy = rebuilt_copy(FIXTURES / "chain-o2-nofp", tmp_path)
    with replay("trace-d-dwarf.ustack", objects=[tmp_path]) as session:
        events = list(session.events())
    refusals = [w for w in session.capture.warnings if str(copy) in w]
    assert len(refusals) == 1
    assert "is not the file recorded as" in refusals[0]
    assert "rebuilt" in refusals[0]
    assert len(events) == CALLS
    for event in events:
        leaf = event.stack.frames[0]
        assert (leaf.module, leaf.function) == ("chain", None)


def test_a_missing_binary_is_named_in_a_warning(tmp_path):
    binary = tmp_path / "chain"
    shutil.copy(FIXTURES / "chain-o2-nofp", binary)
    path = tmp_path / "run.ustack"
    with RecordWriter(path, ["e"], ["fp"], "perf") as writer:
        writer.add_piece(one_process_piece(str(binary)))
    binary.unlink()
    with Session.replay(path) as session:
        events = list(session.events())
    assert session.capture.warnings == [
        f"{binary} (build-id {ElfImage.open(str(FIXTURES / 'chain-o2-nofp')).build_id})"
        " is not here: its frames stay unnamed (give the directory holding a "
        "copy as an objects directory)"]
    assert [(f.module, f.function) for f in events[0].stack.frames] == [("chain", None)] * 3


def cut(src: Path, dst: Path, keep: float) -> Path:
    """dst: a valid gzip file of the first `keep` of src's content."""
    data = gzip.decompress(src.read_bytes())
    dst.write_bytes(gzip.compress(data[:int(len(data) * keep)]))
    return dst


@pytest.mark.parametrize("damage", ["content cut", "file cut", "not gzip",
                                    "bytes flipped", "empty"])
def test_a_damaged_recording_is_one_line_error(tmp_path, damage):
    src = FIXTURES / "trace-d-dwarf.ustack"
    bad = tmp_path / "bad.ustack"
    if damage == "content cut":
        cut(src, bad, 0.6)
    elif damage == "file cut":
        bad.write_bytes(src.read_bytes()[:len(src.read_bytes()) // 2])
    elif damage == "not gzip":
        bad.write_text("hello\n")
    elif damage == "bytes flipped":
        data = bytearray(src.read_bytes())
        for i in range(len(data) // 2, len(data) // 2 + 8):
            data[i] ^= 0xFF
        bad.write_bytes(bytes(data))
    else:
        bad.write_bytes(b"")
    with pytest.raises(UstackError) as caught:
        with Session.replay(bad, objects=[FIXTURES]) as session:
            for _ in session.events():
                pass
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{bad}: ")
    assert any(w in message for w in ("truncated", "corrupt", "not a ustack recording"))


def test_a_missing_recording():
    with pytest.raises(UstackError, match="no such recording"):
        Session.replay("/nonexistent/run.ustack").open()


# -- writing and reading back ------------------------------------------------------------

MAP_START = 0x5555_0000_0000


def one_process_piece(binary: str) -> Piece:
    """chain mapped, and a frame-pointer sample of three frames in it."""
    mapping = Mapping(MAP_START, MAP_START + 0x2000, 0x1000, binary)
    return Piece([CommEvent(100, 100, "chain", True), MmapEvent(100, 100, mapping)],
                 [RawSample(0, 100, 100, 1, 0,
                            callchain=(MAP_START + 0x100).to_bytes(8, "little") * 3)])


def stream_pieces() -> list:
    binary = str(FIXTURES / "chain-o2-nofp")
    mapping = Mapping(MAP_START, MAP_START + 0x2000, 0x1000, binary)
    stack = bytes(range(256)) * 32
    fp = RawSample(0, 100, 101, 123_456_789, 1,
                   callchain=(0x5555_0000_1100).to_bytes(8, "little") * 3,
                   return_address=(0x5555_0000_1200).to_bytes(8, "little"))
    dwarf = RawSample(1, 100, 100, 123_456_999, 0,
                      regs={"bp": 1, "sp": 0x7ffc_0000_0000, "ip": 0x5555_0000_1100},
                      stack=memoryview(stack)[8:],
                      args=(("n", "s64", -3), ("buf", "hex", (1, 2, 2**64 - 1)),
                            ("s", "string", b"hi\xff"), ("gone", "u32", None)),
                      kernel=(0xffff_ffff_8100_0000).to_bytes(8, "little"))
    return [
        Piece([CommEvent(100, 100, "chain", True), MmapEvent(100, 100, mapping),
               MmapEvent(100, 100, Mapping(0x7fff_0000, 0x7fff_2000, 0, "[vdso]"))],
              [fp, dwarf]),
        Piece([ForkEvent(102, 100, 102, 100), CommEvent(102, 103, "wörker\udcff", False)],
              [fp._replace(pid=102, tid=103)]),
        Piece([ExitEvent(102, 100, 102, 100)], []),
    ]


def read_back(path: Path) -> tuple:
    capture = RecordedCapture(path)
    capture.open()
    stream = Stream(capture)
    stream.start()
    pieces = [p for p in stream.rest() if p.metas or p.samples]
    capture.close()
    return capture, pieces


def test_round_trip(tmp_path):
    pieces = stream_pieces()
    losses = Losses(lost=3, throttled=1, uncounted=(("no stack", 2),))
    path = tmp_path / "run.ustack"
    writer = RecordWriter(path, ["uprobe:x:d", "syscall:write"], ["fp", "dwarf"],
                          "perf", {"command": "trace"})
    for piece in pieces:
        writer.add_piece(piece)
    writer.close(losses)
    capture, back = read_back(path)
    assert capture.labels == ("uprobe:x:d", "syscall:write")
    assert capture.modes == ("fp", "dwarf")
    assert capture.header["command"] == "trace"
    assert back == pieces
    assert capture.losses() == losses
    assert capture.warnings == []


def test_round_trip_into_an_open_file(tmp_path):
    path = tmp_path / "run.ustack"
    with open(path, "wb") as f, RecordWriter(f, ["e"], ["fp"], "perf") as writer:
        writer.add_piece(stream_pieces()[0])
    _capture, back = read_back(path)
    assert back == stream_pieces()[:1]


# -- version 2: stacks written once, events, in-kernel counts, unwound samples -----

def test_round_trip_of_stacks_events_and_counts(tmp_path):
    """A frame-pointer event, a DWARF sample unwound while recording (its
    addresses and notes), and stacks counted in the kernel: each distinct
    stack written once, read back as the same samples and counts."""
    fp = stream_pieces()[0].samples[0]
    dwarf = unwound_sample(stream_pieces()[0].samples[1],
                           (0x5555_0000_1100, 0x5555_0000_1200),
                           ("stack copy too small", "frame pointer used for x: no CFI"))
    again = dwarf._replace(time_ns=5)
    again = unwound_sample(again, *dwarf.unwound)
    path = tmp_path / "run.ustack"
    writer = RecordWriter(path, ["uprobe:x:d", "syscall:write"], ["fp", "dwarf"], "perf")
    writer.add_piece(Piece(stream_pieces()[0].metas, [fp, dwarf, again, fp]))
    writer.add_counted([(fp._replace(time_ns=0, cpu=-1), 7)])
    writer.close()
    assert (writer.events, writer.stacks) == (4 + 7, 2)
    capture, back = read_back(path)
    samples = [s for piece in back for s in piece.samples]
    assert samples == [fp, dwarf, again, fp]
    assert [type(s) for s in samples] == [RawSample, UnwoundSample, UnwoundSample, RawSample]
    assert samples[1].unwound == samples[2].unwound == dwarf.unwound
    assert capture.counted() == [(fp._replace(time_ns=0, cpu=-1), 7)]


def test_an_event_of_an_undefined_stack_is_one_line_error(tmp_path):
    path = tmp_path / "bad.ustack"
    fp = stream_pieces()[0].samples[0]
    with gzip.open(path, "wb") as f:
        f.write(rf.MAGIC + rf.header_record(["e"], ["fp"], "perf", {})
                + rf.event_record(fp, 3) + rf.losses_record(Losses()))
    with pytest.raises(UstackError, match="an event of stack 3, never defined"):
        with Session.replay(path) as session:
            list(session.events())


def test_an_exec_keeps_its_time_and_version_2_files_read_without_it():
    """Version 3 stores an exec's time (so a stack recorded just before an
    exec is named from the program before it); version 2's COMM has none."""
    event = CommEvent(7, 7, "chain", True, 123_456_789)
    payload = rf.meta_record(event)[rf.RECORD.size:]
    assert rf.parse_meta(rf.COMM, payload) == event
    old = (7).to_bytes(4, "little") * 2 + b"\x01chain"     # pid, tid, exec, comm
    assert rf.parse_meta(rf.COMM, old, version=2) == CommEvent(7, 7, "chain", True, 0)
    tracker = MappingTracker(live=False)
    for e in (CommEvent(7, 7, "sh", True, 100), CommEvent(7, 7, "chain", True, 200)):
        tracker.apply(e)
    assert [tracker.generation_at(7, t) for t in (50, 150, 250, 0)] == [0, 1, 2, 2]


# -- version 5: the names of Ruby, PHP, Perl and JS frames; 6: Java's -----------------

def _script_recording(path: Path, header_version: int | None = None) -> list:
    """A file of one frame-pointer event whose stack holds a Ruby, a PHP,
    a Perl and a Java frame word (named by I records unless header_version
    is older than them); the words, innermost first."""
    from ustack.model import PHP_FRAME_TAG, java_frame_word, perl_frame_word, ruby_frame_word
    words = [ruby_frame_word(0x7f00_0000_1000, 5),
             PHP_FRAME_TAG | 42 << 16 | 17,         # function 42 at line 17
             perl_frame_word(0x5600_0000_2000, 30),
             java_frame_word(0x7f10_0000_3000, 12)]  # Method* at bci 12
    fp = stream_pieces()[0].samples[0]
    sample = fp._replace(callchain=b"".join(w.to_bytes(8, "little") for w in words)
                         + fp.callchain)
    extra = {"scripts": ["java", "perl", "php", "ruby"]}
    header = rf.header_record(["profile:hz:99"], ["fp"], "bpf", extra)
    if header_version is not None:          # as an older ustack wrote it
        header = rf.header_record(["profile:hz:99"], ["fp"], "bpf", {})
        header = header.replace(f'"version": {rf.VERSION}'.encode(),
                                f'"version": {header_version}'.encode())
        header = rf.record(rf.HEADER, header[rf.RECORD.size:])
    names = b"" if header_version is not None else b"".join((
        rf.script_frame_record(100, words[0], "Worker#c", "/srv/calls.rb", 11),
        rf.script_frame_record(100, words[1], "Spinner::spin", "/srv/chain.php", 17),
        rf.script_frame_record(100, words[2], "main::b", "/srv/calls.pl", 30),
        rf.script_frame_record(100, words[3], "Chain.middle", "Chain.java", 15)))
    with gzip.open(path, "wb") as f:
        f.write(rf.MAGIC + header + names
                + b"".join(rf.meta_record(e) for e in stream_pieces()[0].metas)
                + rf.stack_record(0, sample) + rf.event_record(sample, 0)
                + rf.losses_record(Losses()))
    return words


def test_script_frames_are_named_from_the_recording(tmp_path):
    path = tmp_path / "scripts.ustack"
    _script_recording(path)
    with Session.replay(path, objects=(FIXTURES,)) as session:
        events = list(session.events())
    frames = [(f.function, f.file, f.line, f.kind) for f in events[0].stack.frames if f.kind]
    assert frames == [("Worker#c", "/srv/calls.rb", 11, "ruby"),
                      ("Spinner::spin", "/srv/chain.php", 17, "php"),
                      ("main::b", "/srv/calls.pl", 30, "perl"),
                      ("Chain.middle", "Chain.java", 15, "java")]


@pytest.mark.parametrize("version", [4, 5])
def test_an_older_recording_still_reports(tmp_path, version):
    """A file of a previous format (4: no I records, no script passes; 5:
    no Java frame's): read, its words no interpreter's frames."""
    path = tmp_path / "old.ustack"
    _script_recording(path, header_version=version)
    with Session.replay(path, objects=(FIXTURES,)) as session:
        events = list(session.events())
    assert len(events) == 1
    assert not [f for f in events[0].stack.frames if f.kind], events[0].stack.frames


def test_a_newer_recording_is_one_line_error(tmp_path):
    path = tmp_path / "newer.ustack"
    _script_recording(path, header_version=rf.VERSION + 1)
    with pytest.raises(UstackError, match=f"recording format version {rf.VERSION + 1} is "
                                          f"newer than this ustack reads \\({rf.VERSION}\\)"):
        with Session.replay(path) as session:
            list(session.events())


def test_a_script_record_of_no_interpreter_word_is_one_line_error(tmp_path):
    path = tmp_path / "bad.ustack"
    with gzip.open(path, "wb") as f:
        f.write(rf.MAGIC + rf.header_record(["e"], ["fp"], "perf", {})
                + rf.script_frame_record(1, 0x5555_0000_1100, "f", "/x.rb", 1)
                + rf.losses_record(Losses()))
    with pytest.raises(UstackError, match=r"corrupt recording \(an interpreter frame "
                                          r"record of word 0x555500001100\)"):
        with Session.replay(path) as session:
            list(session.events())
