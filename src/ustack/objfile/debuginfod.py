"""Debug files from debuginfod servers (the ones perf, gdb and eu-stack ask):
GET URL/buildid/HEX/debuginfo for an object that has no names or lines on
disk, once, into ustack's private cache (cache_root()/debuginfod/HEX.debug).

The servers are the user's: `--debuginfod URL`, else DEBUGINFOD_URLS
(space-separated, as elfutils reads it); none is asked otherwise, also for
a root run. Fetches run on one background thread, so a run never waits on
the network: a frame met before its file arrived stays unnamed, and
`arrivals` tells the symbolizer to name again. A server down, slow or
answering garbage costs that thread its timeouts, never the run. A fetched
file is used only when its build-id note is the one asked for; else it is
refused (one sentence) and deleted.

http.client is imported only on that thread, when a server is configured:
start-up of a run without servers pays nothing."""
from __future__ import annotations

import os

from . import cache as objcache
from .fetched_debug import cache_path, cached_debug_file, valid_build_id

CONNECT_S = 2.0            # to reach a server
TOTAL_S = 60.0             # for one file, from one server
MAX_BYTES = 2 << 30        # a debug file larger than this is garbage
# files asked of the servers in one run: a whole-machine run meets hundreds
# of objects, and must not turn into a mirror of the distribution's
MAX_FETCHES = 100
NOT_THERE = "404"          # why a file is missing: the servers have none
REFUSED = "refused"        # … the file sent was not the one asked for (said apart)


def server_urls(option_urls=()) -> tuple:
    """The servers to ask: --debuginfod's, else DEBUGINFOD_URLS'."""
    urls = list(option_urls) or os.environ.get("DEBUGINFOD_URLS", "").split()
    return tuple(u.rstrip("/") for u in urls if u.startswith(("http://", "https://")))


class Fetcher:
    """Asks the servers for debug files on one daemon thread. want(path)
    queues an object met in the run (its ELF is read on the thread too);
    ask(build_id, path) one already known to lack names."""

    def __init__(self, urls: tuple, want_lines: bool = False, debug_dirs=()):
        self.urls = urls
        self.want_lines = want_lines
        self.debug_dirs = tuple(debug_dirs)
        self.arrivals = 0              # grows when a file arrives
        self.notes: list = []          # refusals, one sentence each
        self.missing: dict = {}        # build-id -> why no server gave it (NOT_THERE: none had it)
        self.fetches = 0               # build-ids asked of the servers
        self.over_bound: list = []     # paths not asked for, past MAX_FETCHES
        self._servers_said: set = set()
        self._finished: set = set()    # build-ids asked for whose fetch ended
        self._ended = None             # a Condition: told when one ends
        self._seen: set = set()        # paths and build-ids queued once
        self._queue = None
        self._thread = None

    def want(self, path: str) -> None:
        """An object the run met: fetch its debug file if it needs one."""
        if path.startswith("/") and path not in self._seen:   # not [vdso], [heap]
            self._seen.add(path)
            self._put(("path", path))

    def ask(self, build_id: str, path: str) -> None:
        if valid_build_id(build_id) and build_id not in self._seen:
            self._seen.add(build_id)
            self._put(("build-id", build_id, path))

    def wait_for(self, build_id: str, deadline: float) -> bool:
        """Wait (until time.monotonic() `deadline`) for the fetch asked for
        build_id to end: whether its file is in the cache."""
        import time
        if build_id in self._seen and self._ended is not None:
            with self._ended:
                while build_id not in self._finished:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._ended.wait(min(left, 0.5))
        return cached_debug_file(build_id) is not None

    def _put(self, item) -> None:
        if self._thread is None:
            import queue
            import threading
            self._queue = queue.SimpleQueue()
            self._ended = threading.Condition()
            self._thread = threading.Thread(target=self._work, name="debuginfod",
                                            daemon=True)
            self._thread.start()
        self._queue.put(item)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item[0] == "path":
                    self._consider(item[1])
                else:
                    self._fetch(item[1], item[2])
            except Exception as e:         # noqa: BLE001 (a fetch never breaks a run)
                self.notes.append(f"debuginfod: {e}")
            finally:
                if item[0] == "build-id":
                    with self._ended:
                        self._finished.add(item[1])
                        self._ended.notify_all()

    def _consider(self, path: str) -> None:
        """Ask for `path`'s debug file when it has no names (or, with
        --lines, no DWARF) on disk and no local debug file."""
        from ..model import UstackError
        from .debuginfo import find_debug_file
        from .dwarf_lines import has_dwarf
        from .elf import ElfImage
        try:
            image = ElfImage(path)
        except UstackError:
            return
        build_id = image.file.build_id
        if not valid_build_id(build_id) or build_id in self._seen:
            return
        if image.file.has_symtab and not (self.want_lines and not has_dwarf(image)):
            return
        if cached_debug_file(build_id) or find_debug_file(image, self.debug_dirs).path:
            return
        # /proc/PID/exe (a -p target) is said as the file it is
        self.ask(build_id, os.path.realpath(path) if path.startswith("/proc/") else path)

    def _fetch(self, build_id: str, path: str) -> None:
        if cached_debug_file(build_id) is not None:
            return
        if self.fetches >= MAX_FETCHES:
            self.over_bound.append(path)
            self.missing[build_id] = "not asked"    # said apart, not as "still coming"
            return
        self.fetches += 1
        why = {}
        try:
            for url in self.urls:
                why[url] = self._keep(build_id, path, url)
                if why[url] is None:
                    return
        finally:
            if why.get(url, "") is not None:       # no server gave it
                self.missing[build_id] = (NOT_THERE if set(why.values()) == {NOT_THERE}
                                          else "failed")
        for url, failure in why.items():
            if failure not in (NOT_THERE, REFUSED) and url not in self._servers_said:
                self._servers_said.add(url)        # a server down: said once
                self.notes.append(f"debuginfod {url}: {failure}")

    def _keep(self, build_id: str, path: str, url: str) -> str | None:
        """Download the server's answer into the cache; keep it only when it
        is the debug file asked for. None once kept, else why not
        (NOT_THERE: the server has no such file)."""
        from .elf import ElfImage
        out = cache_path(build_id)
        unchecked = out + ".unchecked"    # never where a reader looks, until checked
        failed: list = []
        if not objcache.write_chunks(unchecked, _noting(
                _download(f"{url}/buildid/{build_id}/debuginfo"), failed)):
            return _why(failed[0]) if failed else "its file could not be cached"
        if not objcache.trusted_file(unchecked):
            return "its file could not be cached"
        try:
            got = ElfImage(unchecked).file.build_id
        except Exception:                   # noqa: BLE001 (garbage of any shape)
            got = False
        if got != build_id:
            what = "is no ELF file" if got is False else f"has build-id {got or 'none'}"
            self.notes.append(f"debuginfod {url}: the file sent as the debug file of "
                              f"{path} (build-id {build_id}) {what}; refused and deleted")
            objcache.remove(unchecked)
            return REFUSED
        if not objcache.rename(unchecked, os.path.basename(out)):
            objcache.remove(unchecked)
            return "its file could not be cached"
        self.arrivals += 1
        return None

    def not_named_notes(self, named_without: dict) -> list:
        """What to say of `named_without` ({path: build-id}, objects whose
        frames were named without a debug file): which no server has, and
        which had theirs still coming; and what the run did not ask for,
        past its bound."""
        missing = dict(self.missing)
        absent = sorted(p for p, b in named_without.items() if missing.get(b) == NOT_THERE)
        waiting = sorted(p for p, b in named_without.items() if b not in missing)
        notes = []
        if absent:
            notes.append(f"debuginfod: no server has the debug file of {_listed(absent)} "
                         "(404): their frames stay unnamed")
        if waiting:
            notes.append(f"debuginfod: the debug files of {_listed(waiting)} had not "
                         "arrived when their frames were named: those are not named (a "
                         "later `ustack report` of a recording names them)")
        if self.over_bound:
            notes.append(f"debuginfod: {MAX_FETCHES} debug files asked for, the most a "
                         f"run asks; not asked: {_listed(sorted(set(self.over_bound)))}")
        return notes


def _listed(paths: list, shown: int = 5) -> str:
    """Paths in one line: the first few, then how many more."""
    more = len(paths) - shown
    return ", ".join(paths[:shown]) + (f" and {more} more" if more > 0 else "")


def _why(e: OSError) -> str:
    if isinstance(e, TimeoutError) or "timed out" in str(e):
        return "no answer in time"
    return e.strerror or str(e) or type(e).__name__


def _noting(chunks, failed: list):
    """`chunks`, with the OSError that ends them kept in `failed` (the
    cache writer swallows it)."""
    try:
        yield from chunks
    except OSError as e:
        failed.append(e)
        raise


def _download(url: str):
    """The body of a 200 answer to GET url, in chunks; OSError on any
    failure (another status, a timeout, a body too large): a connect
    timeout, then a deadline for the whole answer."""
    import http.client
    import time
    import urllib.parse
    deadline = time.monotonic() + TOTAL_S
    try:
        parts = urllib.parse.urlsplit(url)
        kind = (http.client.HTTPSConnection if parts.scheme == "https"
                else http.client.HTTPConnection)
        conn = kind(parts.hostname, parts.port, timeout=CONNECT_S)
    except ValueError as e:                 # a URL without a host or port that is one
        raise OSError(str(e)) from None
    try:
        conn.connect()
        sock = conn.sock        # kept: the connection forgets it once told to close
        conn.request("GET", parts.path)
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        answer = conn.getresponse()
        if answer.status == 404:
            raise OSError(NOT_THERE)
        if answer.status != 200:
            raise OSError(f"answered HTTP {answer.status}")
        length = answer.getheader("Content-Length")
        if length and (not length.isdigit() or int(length) > MAX_BYTES):
            raise OSError(f"a Content-Length of {length[:20]}")
        size = 0
        while not answer.isclosed():   # closed once the body was read whole
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise OSError(f"the file not whole within {TOTAL_S:g} s")
            sock.settimeout(remaining)
            chunk = answer.read(1 << 20)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_BYTES:
                raise OSError(f"a file larger than {MAX_BYTES} bytes")
            yield chunk
    except (http.client.HTTPException, ValueError) as e:
        raise OSError(f"not an HTTP answer ({type(e).__name__})") from None
    finally:
        conn.close()


_fetchers: dict = {}


def fetcher(urls: tuple, want_lines: bool = False, debug_dirs=()) -> Fetcher | None:
    """The run's one Fetcher for these servers (None: no server)."""
    if not urls:
        return None
    key = (urls, want_lines, tuple(debug_dirs))
    if key not in _fetchers:
        _fetchers[key] = Fetcher(urls, want_lines, debug_dirs)
    return _fetchers[key]


def fetch_for_run(symbols, tracker, main: str | None) -> None:
    """Ask for the debug files of a run's objects as soon as they are
    mapped (`tracker`: the run's mapping tracker, whose on_object hook is
    set), the program's (`main`) at once: a count or profile run, named at
    its end, then gets the names of the files that arrived meanwhile."""
    found = fetcher(server_urls(symbols.debuginfod), symbols.lines or symbols.inlines,
                    symbols.debug_dirs)
    if found is None:
        return
    tracker.on_object = found.want
    if main:
        found.want(main)
