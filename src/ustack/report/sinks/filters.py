"""What `report --from` keeps, whichever the source (a ClickHouse
server, a directory of `--every` files): the filters, and the times they
take."""
from __future__ import annotations

import calendar
import decimal
import time

from ...model import UstackError
from ...values import value


@value
class Filter:
    """What `report --from` keeps: each field empty keeps all."""
    hosts: tuple = ()
    comms: tuple = ()
    pids: tuple = ()
    containers: tuple = ()           # ids, or their first characters (docker ps shows 12)
    since_ns: int | None = None
    until_ns: int | None = None
    event: str = ""


def parse_time(text: str, option: str) -> int:
    """--since/--until: seconds since the epoch, or an ISO time in UTC
    (2026-11-28T10:00:00, 2026-11-28 10:00, 2026-11-28); nanoseconds."""
    text = text.strip()
    try:                                 # exact to the nanosecond: no float
        return int(decimal.Decimal(text).scaleb(9).to_integral_value())
    except (decimal.InvalidOperation, ValueError):
        pass
    for layout in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M",
                   "%Y-%m-%d %H:%M", "%Y-%m-%d"):
        try:
            return calendar.timegm(time.strptime(text.rstrip("Z"), layout)) * 10**9
        except ValueError:
            continue
    raise UstackError(f"{option} {text!r}: a time is seconds since the epoch or "
                      "2026-11-28T10:00:00 (UTC)")


def id_set(text, what: str) -> frozenset:
    """report's --pid and --tid: numbers separated by commas."""
    if not text:
        return frozenset()
    try:
        return frozenset(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UstackError(f"--{what} takes numbers separated by commas, "
                          f"not {text!r}") from None
