"""`--to clickhouses://` and `report --from clickhouses://`: HTTPS to a
clickhouse-server started here with a certificate of a CA made here
(openssl), on loopback. The server's certificate is checked: one of a
CA not given is refused in one line (the intervals stay queued); with
--ca the CA's file, or the system's store naming it, the run sends and
the report reads."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from helpers import build, fail_one_line, run_ustack, ustack_env
from test_clickhouse import ClickHouse, file_stacks, folded_stacks, free_port, queued

pytestmark = pytest.mark.kernel


def make_ca(directory, name: str):
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-keyout", str(directory / f"{name}.key"), "-out",
                    str(directory / f"{name}.crt"), "-subj", f"/CN=ustack {name}"],
                   check=True, capture_output=True)
    return directory / f"{name}.crt"


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    """(the server, its https address, the CA that signed its certificate,
    another CA); the certificate names 127.0.0.1 and localhost."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    root = tmp_path_factory.mktemp("tls")
    ca, other = make_ca(root, "ca"), make_ca(root, "other")
    subprocess.run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
                    "-keyout", str(root / "server.key"), "-out", str(root / "server.csr")],
                   check=True, capture_output=True)
    (root / "ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    subprocess.run(["openssl", "x509", "-req", "-days", "2", "-in", str(root / "server.csr"),
                    "-CA", str(ca), "-CAkey", str(root / "ca.key"), "-CAcreateserial",
                    "-out", str(root / "server.crt"), "-extfile", str(root / "ext")],
                   check=True, capture_output=True)
    https = free_port()
    server = ClickHouse(root, extra=(
        f"--https_port={https}", f"--openSSL.server.certificateFile={root}/server.crt",
        f"--openSSL.server.privateKeyFile={root}/server.key",
        "--openSSL.server.dhParamsFile="))
    server.start()
    yield server, f"clickhouses://127.0.0.1:{https}/ustack", ca, other
    server.stop()


def test_a_certificate_of_a_ca_not_given_is_refused_in_one_line(tls_server):
    _server, url, _ca, other = tls_server
    for extra in ([], ["--ca", str(other)]):
        message = fail_one_line(run_ustack("report", "--from", url, *extra))
        assert message.endswith("the server's certificate is refused (unable to get local "
                                "issuer certificate): give the CA that signed it with "
                                "--ca FILE"), message


def test_with_its_ca_an_agent_sends_over_https_and_the_report_reads_it(tls_server,
                                                                         tmp_path):
    server, url, ca, other = tls_server
    busy, out, queue = build("busy"), tmp_path / "out", tmp_path / "queue"
    refused = run_ustack("profile", "-F", "99", "--every", "0.5", "-d", "1", "-o", f"{out}/",
                         "--to", url, "--ca", str(other), "--host-label", "tls",
                         "--queue", str(queue), "-c", f"{busy} 60", timeout=120)
    assert refused.returncode == 0, refused.stderr
    said = [ln for ln in refused.stderr.splitlines() if "certificate is refused" in ln]
    assert len(said) == 1 and said[0].startswith("ustack: "), refused.stderr
    assert queued(queue), refused.stderr              # kept for a run that trusts it
    sent = run_ustack("profile", "-F", "99", "--every", "0.5", "-d", "1", "-o", f"{out}/",
                      "--to", url, "--ca", str(ca), "--host-label", "tls",
                      "--queue", str(queue), "-c", f"{busy} 60", timeout=120)
    assert sent.returncode == 0, sent.stderr
    assert not queued(queue), sent.stderr
    read = run_ustack("report", "--from", url, "--ca", str(ca), "-f", "folded")
    assert read.returncode == 0, read.stderr
    assert folded_stacks(read.stdout) == file_stacks(list(out.iterdir()))
    # the system's store: OpenSSL's SSL_CERT_FILE names the CA, no --ca
    system = subprocess.run([sys.executable, "-m", "ustack", "report", "--from", url,
                             "-f", "folded"], env=dict(ustack_env(), SSL_CERT_FILE=str(ca)),
                            capture_output=True, text=True, timeout=60)
    assert system.returncode == 0 and system.stdout == read.stdout, system.stderr


def test_ca_goes_with_https_only(tls_server):
    server, _url, ca, _other = tls_server
    assert "a certificate is checked over HTTPS only" in fail_one_line(
        run_ustack("report", "--from", server.url, "--ca", str(ca)))
    assert "no such file" in fail_one_line(
        run_ustack("report", "--from", "clickhouses://127.0.0.1:1/ustack", "--ca",
                   os.devnull + "x"))
