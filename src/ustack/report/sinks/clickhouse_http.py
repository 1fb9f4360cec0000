"""ClickHouse over HTTP (the 18.16 of Debian speaks it): the
clickhouse://HOST:PORT/DB address, or clickhouses:// for HTTPS (the
server's certificate checked against --ca FILE, else the system's CAs,
and its name against the address's host), credentials from the
environment or a file (never the command line), one request at a time,
each failure one line. Only socket and ssl: nothing to install."""
from __future__ import annotations

import base64
import contextlib
import os
import re
import socket
import ssl
import urllib.parse

from ...model import UstackError

SCHEME = "clickhouse://"
TLS_SCHEME = "clickhouses://"
SCHEMES = (SCHEME, TLS_SCHEME)
DEFAULT_PORTS = {"clickhouse": 8123, "clickhouses": 8443}   # ClickHouse's HTTP and HTTPS
USER_ENV, PASSWORD_ENV = "USTACK_CLICKHOUSE_USER", "USTACK_CLICKHOUSE_PASSWORD"
CREDENTIALS_ENV = "USTACK_CLICKHOUSE_CREDENTIALS"   # a file: `user:password`
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class NotHttp(Exception):
    """What answered is not an HTTP server."""


class ServerError(Exception):
    """The server could not be reached, or refused or garbled an answer:
    worth trying again later (the sender queues), said in one line.
    `status`: the HTTP status of a refusal, else 0."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


def is_clickhouse(text: str | None) -> bool:
    return bool(text) and text.startswith(SCHEMES)


def quote(text: str) -> str:
    """A string literal for ClickHouse SQL (18.16 has no query parameters)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


class Server:
    """One ClickHouse database reached over HTTP."""

    def __init__(self, address: str, timeout: float = 10.0, ca: str | None = None):
        parsed = urllib.parse.urlsplit(address)
        if parsed.scheme not in DEFAULT_PORTS or not parsed.hostname:
            raise UstackError(f"{address}: not a ClickHouse address "
                              "(clickhouse://HOST:PORT/DATABASE, or clickhouses:// for HTTPS)")
        if parsed.username or parsed.password:
            raise UstackError(f"{SCHEME}: no credentials in the address (they would "
                              f"show in ps): set {USER_ENV} and {PASSWORD_ENV}, or name "
                              f"a file of user:password in {CREDENTIALS_ENV}")
        database = parsed.path.strip("/") or "ustack"
        if not _NAME.match(database):
            raise UstackError(f"{address}: {database!r} is not a database name "
                              "(letters, digits, _)")
        try:
            self.port = parsed.port or DEFAULT_PORTS[parsed.scheme]
        except ValueError:
            raise UstackError(f"{address}: the port is not a number") from None
        self.host, self.database, self.timeout = parsed.hostname, database, timeout
        self.address = f"{parsed.scheme}://{self.host}:{self.port}/{database}"
        if ca and parsed.scheme != "clickhouses":
            raise UstackError(f"--ca {ca}: a certificate is checked over HTTPS only: "
                              f"give clickhouses://{self.host}:PORT/{database}")
        self.ca = ca
        self._tls = _tls_context(ca) if parsed.scheme == "clickhouses" else None
        self._auth = _authorization()
        self._kept = 0               # kept_alive() depth: >0, one connection serves all
        self._sock = None            # that connection, once opened

    @contextlib.contextmanager
    def kept_alive(self):
        """Requests made inside go over one connection (HTTP/1.1
        keep-alive), closed at the end: for requests made one after the
        other (the schema's statements, an interval's inserts), ~3 times
        less CPU each than a connection a request. Outside, a request has
        its own connection (a server closes one idle for a few seconds)."""
        self._kept += 1
        try:
            yield self
        finally:
            self._kept -= 1
            if not self._kept:
                self._drop()

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def query(self, sql: str, body: bytes = b"") -> bytes:
        """The answer to `sql` (with `body` as the data of an INSERT);
        ServerError when there is none, or a refusal."""
        path = "/?" + urllib.parse.urlencode({"query": sql}) if body else "/"
        data = body if body else sql.encode()
        try:
            status, reason, text = self._exchange(path, data)
        except (OSError, NotHttp) as e:
            raise ServerError(f"{self.address}: {_why(e)}") from None
        if status != 200:
            first = text.decode("utf-8", "replace").strip().splitlines()
            raise ServerError(f"{self.address}: HTTP {status}: "
                              f"{first[0][:200] if first else reason}", status)
        return text

    def _exchange(self, path: str, data: bytes) -> tuple:
        """(status, reason, body) of one POST: HTTP/1.0, so that the server
        closes the connection after its answer and sends it whole, not in
        chunks, or inside kept_alive() HTTP/1.1 over the one connection;
        the request's head and body in one send (http.client sent them
        apart and parsed the answer's head with the email package: ~250 us
        of CPU a request, against ~100 here)."""
        keep = self._kept > 0
        host = f"[{self.host}]" if ":" in self.host else self.host     # IPv6
        head = (f"POST {path} HTTP/1.{int(keep)}\r\nHost: {host}:{self.port}\r\n"
                f"Content-Type: text/plain\r\nContent-Length: {len(data)}\r\n"
                + (f"Authorization: {self._auth}\r\n" if self._auth else "")
                + "\r\n").encode("latin-1")
        sock = self._sock if keep else None
        if sock is None:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
            if self._tls is not None:
                try:
                    sock = self._tls.wrap_socket(sock, server_hostname=self.host)
                except BaseException:
                    sock.close()
                    raise
        self._sock = None            # back once its answer is read whole
        try:
            if self._tls is not None:
                sock.sendall(head + data)
            else:
                sent = sock.sendmsg([head, data])
                if sent < len(head):     # (with a timeout, a send may be partial)
                    sock.sendall(head[sent:])
                    sent = len(head)
                sock.sendall(memoryview(data)[sent - len(head):])
            answer, reusable = _read_answer(sock)
        except BaseException:
            sock.close()
            raise
        if keep and reusable:
            self._sock = sock
        else:
            sock.close()
        return _parse_answer(answer)

    def rows(self, sql: str) -> list:
        """The rows of a SELECT as lists (JSONCompact's data)."""
        import json
        text = self.query(sql + " FORMAT JSONCompact")
        try:
            return json.loads(text)["data"]
        except (ValueError, KeyError, TypeError):
            first = (text[:60].decode("utf-8", "replace").splitlines() or [""])[0]
            raise ServerError(f"{self.address}: the answer is not ClickHouse's JSON: "
                              f"{first!r}") from None

    def table(self, sql: str, columns: int) -> list:
        """The rows of a SELECT of `columns` columns as lists of strings
        (TabSeparated: ~5 times quicker to fetch and split than JSON for
        a flame graph's 5,000 stacks of 20 frames)."""
        text = self.query(sql + " FORMAT TabSeparated").decode("utf-8", "replace")
        rows = [line.split("\t") for line in text.split("\n") if line]
        for row in rows:
            if len(row) != columns:
                raise ServerError(f"{self.address}: the answer is not ClickHouse's table: "
                                  f"{text[:60].splitlines()[0]!r}")
            for i, field in enumerate(row):
                if "\\" in field:
                    row[i] = _TSV_ESCAPE.sub(_unescaped, field)
        return rows


def _read_answer(sock) -> tuple:
    """(the server's answer, whether the connection can serve another):
    as long as its Content-Length or its chunks say, else until the
    server closes the connection."""
    answer = bytearray()

    def more() -> bool:
        part = sock.recv(1 << 16)
        answer.extend(part)
        return bool(part)
    end = answer.find(b"\r\n\r\n")
    while end < 0:
        if not more():
            return bytes(answer), False
        end = answer.find(b"\r\n\r\n")
    head = bytes(answer[:end])
    body = end + 4
    reusable = not _CLOSE.search(head) and head.startswith(b"HTTP/1.1")
    length = _CONTENT_LENGTH.search(head)
    if length:
        while len(answer) < body + int(length.group(1)):
            if not more():
                return bytes(answer), False
        return bytes(answer), reusable
    if _CHUNKED.search(head):
        at = body                    # each chunk: its size in hex, CRLF, its bytes, CRLF
        while True:
            eol = answer.find(b"\r\n", at)
            while eol < 0:
                if not more():
                    return bytes(answer), False
                eol = answer.find(b"\r\n", at)
            try:
                size = int(bytes(answer[at:eol]).split(b";")[0], 16)
            except ValueError:
                return bytes(answer), False      # _parse_answer says what is wrong
            if size == 0:            # the last, then no trailer but its CRLF
                while len(answer) < eol + 4:
                    if not more():
                        return bytes(answer), False
                return bytes(answer), reusable and answer[eol + 2:eol + 4] == b"\r\n"
            at = eol + 2 + size + 2
            while len(answer) < at:
                if not more():
                    return bytes(answer), False
    while more():                    # neither: the answer ends with the connection
        pass
    return bytes(answer), False


_CLOSE = re.compile(rb"\r\nconnection: *close", re.I)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding: *chunked", re.I)
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length: *(\d+)", re.I)


def _parse_answer(answer: bytes) -> tuple:
    """(status, reason, body) of an HTTP answer read whole; NotHttp when
    it is not one."""
    end = answer.find(b"\r\n\r\n")
    if not answer.startswith(b"HTTP/") or end < 0:
        raise NotHttp("no status line" if answer else "no answer")
    lines = answer[:end].decode("latin-1").split("\r\n")
    version_status_reason = lines[0].split(" ", 2)
    try:
        status = int(version_status_reason[1])
    except (IndexError, ValueError):
        raise NotHttp("no status") from None
    reason = version_status_reason[2] if len(version_status_reason) > 2 else ""
    headers = dict(line.partition(":")[::2] for line in lines[1:])
    headers = {name.strip().lower(): value.strip() for name, value in headers.items()}
    body = answer[end + 4:]
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = _unchunked(body)
    elif "content-length" in headers:
        try:
            length = int(headers["content-length"])
        except ValueError:
            raise NotHttp("a bad Content-Length") from None
        if len(body) < length:
            raise NotHttp("the answer ended early")
        body = body[:length]
    return status, reason, body


def _unchunked(body: bytes) -> bytes:
    """A chunked body's data (a server may answer HTTP/1.0 so)."""
    out, at = [], 0
    while True:
        eol = body.find(b"\r\n", at)
        try:
            size = int(body[at:eol].split(b";")[0], 16) if eol >= 0 else -1
        except ValueError:
            size = -1
        if size < 0 or eol + 2 + size > len(body):
            raise NotHttp("a bad chunk")
        if size == 0:
            return b"".join(out)
        out.append(body[eol + 2:eol + 2 + size])
        at = eol + 2 + size + 2


# TabSeparated's escapes (ClickHouse's writeEscapedString)
_TSV_ESCAPE = re.compile(r"\\(.)", re.S)
_TSV_CHARS = {"b": "\b", "f": "\f", "r": "\r", "n": "\n", "t": "\t", "0": "\0",
              "'": "'", "\\": "\\"}


def _unescaped(m) -> str:
    return _TSV_CHARS.get(m.group(1), m.group(1))


def _tls_context(ca: str | None):
    """Certificates checked, and the host's name: against the CA file
    given, else the system's store."""
    try:
        return ssl.create_default_context(cafile=ca)
    except FileNotFoundError:
        raise UstackError(f"--ca {ca}: no such file") from None
    except (ssl.SSLError, OSError) as e:
        raise UstackError(f"--ca {ca}: not a PEM certificate file "
                          f"({getattr(e, 'reason', None) or e})") from None


def _why(e: Exception) -> str:
    if isinstance(e, ssl.SSLCertVerificationError):
        return (f"the server's certificate is refused ({e.verify_message}): give the "
                "CA that signed it with --ca FILE")
    if isinstance(e, ssl.SSLError):
        return f"TLS failed ({e.reason or e}): is this ClickHouse's HTTPS port?"
    if isinstance(e, ConnectionRefusedError):
        return "connection refused (is clickhouse-server running there?)"
    if isinstance(e, TimeoutError) or "timed out" in str(e):
        return "no answer in time"
    if isinstance(e, NotHttp):
        return f"not an HTTP answer ({e}): is this a ClickHouse HTTP port?"
    return getattr(e, "strerror", None) or str(e) or type(e).__name__


def _authorization() -> str:
    """HTTP basic auth from USTACK_CLICKHOUSE_USER/PASSWORD, or from the
    file USTACK_CLICKHOUSE_CREDENTIALS names (`user:password`); '' for
    the server's default user."""
    user, password = os.environ.get(USER_ENV, ""), os.environ.get(PASSWORD_ENV, "")
    path = os.environ.get(CREDENTIALS_ENV)
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                user, _, password = f.readline().rstrip("\n").partition(":")
        except OSError as e:
            raise UstackError(f"{CREDENTIALS_ENV}={path}: {e.strerror}") from None
    if not user:
        return ""
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return f"Basic {token}"
