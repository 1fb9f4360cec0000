"""ClickHouse over HTTP (the 18.16 of Debian speaks it): the
clickhouse://HOST:PORT/DB address, or clickhouses:// for HTTPS (the
server's certificate checked against --ca FILE, else the system's CAs,
and its name against the address's host), credentials from the
environment or a file (never the command line), one request at a time,
each failure one line. Only http.client and ssl: nothing to install."""
from __future__ import annotations

import base64
import http.client
import os
import re
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

    def query(self, sql: str, body: bytes = b"") -> bytes:
        """The answer to `sql` (with `body` as the data of an INSERT);
        ServerError when there is none, or a refusal."""
        path = "/?" + urllib.parse.urlencode({"query": sql}) if body else "/"
        data = body if body else sql.encode()
        headers = {"Content-Type": "text/plain"}
        if self._auth:
            headers["Authorization"] = self._auth
        if self._tls is not None:
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout,
                                               context=self._tls)
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.request("POST", path, body=data, headers=headers)
            answer = conn.getresponse()
            text = answer.read()
        except (OSError, http.client.HTTPException) as e:
            raise ServerError(f"{self.address}: {_why(e)}") from None
        finally:
            conn.close()
        if answer.status != 200:
            first = text.decode("utf-8", "replace").strip().splitlines()
            raise ServerError(f"{self.address}: HTTP {answer.status}: "
                              f"{first[0][:200] if first else answer.reason}", answer.status)
        return text

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
    if isinstance(e, http.client.HTTPException):
        return f"not an HTTP answer ({type(e).__name__}): is this a ClickHouse HTTP port?"
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
