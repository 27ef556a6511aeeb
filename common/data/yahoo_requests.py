"""The yfinance client common.data.yahoo hands its requests to, how each Yahoo chart request
ended, and what yfinance logged about each ticker.

yf.download keeps its reasons to itself, so common.data.yahoo watches the HTTP session it hands
to yfinance (`ChartLog`: how each /v8/finance/chart/<TICKER> request ended) and captures
yfinance's log records during a call (`LogCapture`); `ChartLog.problem` turns both into a
`Problem`: unreachable (network, rate limit: a rerun fetches the ticker) or no data (delisted,
renamed, or an answer yfinance could not read). See common.data.yahoo's docstring for the why.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Iterator
from urllib.parse import unquote, urlsplit

import requests

__all__ = [
    "NO_DATA",
    "ChartLog",
    "LogCapture",
    "Problem",
    "clear_request_cache",
    "import_yfinance",
    "new_session",
    "quiet_yfinance",
    "requests_session",
]

NO_DATA = "no data: delisted or renamed?"


@dataclass
class Problem:
    unreachable: bool  # network or rate limit (worth calling the source down) vs. no data
    reason: str
    rate_limited: bool = False  # HTTP 429: wait at least yahoo.RATE_LIMIT_DELAY_S before asking again


class ChartLog:
    """How each chart request ended, per ticker, noted by wrapping the session's `get`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, Problem | None] = {}  # ticker -> last outcome (None: got candles)
        self._other: str | None = None  # the last error on any other Yahoo URL (cookie, crumb)

    @contextlib.contextmanager
    def watching(self, session: Any) -> Iterator[None]:
        original = session.get

        def get(*args: Any, **kwargs: Any) -> Any:
            url = kwargs.get("url", args[0] if args else "")
            ticker = _chart_ticker(str(url))
            try:
                response = original(*args, **kwargs)
            except Exception as e:
                if ticker:
                    self._note(ticker, Problem(True, f"{type(e).__name__}: {_short(e)}"))
                else:
                    with self._lock:
                        self._other = f"{type(e).__name__} from {urlsplit(str(url)).hostname}: {_short(e)}"
                raise
            if ticker:
                self._note(ticker, _judge(response))
            return response

        own = vars(session).get("get")  # normally None: `get` comes from the class
        session.get = get  # yfinance calls session.get(url=..., params=..., timeout=...)
        try:
            yield
        finally:
            if own is None:
                del session.get
            else:
                session.get = own

    def _note(self, ticker: str, outcome: Problem | None) -> None:
        with self._lock:
            self._last[ticker] = outcome

    def problem(self, ticker: str, what: str, logged: str = "") -> Problem:
        """Why `ticker` came back without candles; `what` describes the request for the message,
        `logged` is what yfinance logged about the ticker during the call."""
        with self._lock:
            seen = ticker in self._last
            last = self._last.get(ticker)
            other = self._other
        said = f"; yfinance: {logged}" if logged else ""
        if not seen:  # failed before reaching the chart API (cookie/crumb step): no answer at all
            # (yfinance's own guess here, "possibly delisted", is wrong: it got no answer either)
            return Problem(True, "no answer from Yahoo" + (f" ({other})" if other else ""))
        if last is None and logged:  # Yahoo answered 200 with a chart; yfinance failed on it
            return Problem(False, f"Yahoo answered, but yfinance could not read the answer for {what} ({logged})")
        if last is None:  # Yahoo answered with a chart, yet no candles survived for the range
            return Problem(False, f"{NO_DATA} (Yahoo returned no candles for {what})")
        if last.unreachable or not logged or logged in last.reason:  # nothing new in the log
            return last
        return Problem(False, last.reason + said)


def _chart_ticker(url: str) -> str | None:
    path = urlsplit(url).path
    marker = "/v8/finance/chart/"
    return unquote(path.split(marker, 1)[1]).upper() if marker in path else None


def _judge(response: Any) -> Problem | None:
    """None for an answer with data; otherwise what went wrong."""
    status = int(response.status_code)
    if status == 429:
        return Problem(True, "rate limited by Yahoo (HTTP 429 Too Many Requests)", rate_limited=True)
    if status >= 500:
        return Problem(True, f"Yahoo server error (HTTP {status})")
    description = None
    if status >= 400 or len(response.content) < 4096:  # only small answers can be errors
        with contextlib.suppress(Exception):
            body = response.json()
            error = (body.get("chart") or body.get("finance") or {}).get("error")
            description = error.get("description") if error else None
    if status in (401, 403):  # e.g. "Invalid Crumb": Yahoo refuses this client, the ticker is fine
        return Problem(True, f"Yahoo refused the request (HTTP {status}: {description or 'no reason given'})")
    if description and description.startswith("Data doesn't exist"):
        # A range with no data at all (e.g. it ends before the listing): the ticker itself is fine.
        return Problem(False, f"no data in the requested range (Yahoo: {description})")
    if status >= 400 or description:
        detail = description or f"HTTP {status}"
        return Problem(False, f"{NO_DATA} (Yahoo: {detail})")
    return None


class LogCapture(logging.Handler):
    """yfinance's log records during one call, to find what it said about each ticker."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.messages.append(" ".join(record.getMessage().split()))

    def about(self, ticker: str, n: int = 240) -> str:
        """The distinct messages that name `ticker` ('T' in a list or a quote, or yfinance's $T:)."""
        marks = (f"'{ticker}'", f"${ticker}:")
        found: list[str] = []
        for message in self.messages:
            if any(m in message for m in marks):
                text = message.split("]: ", 1)[1] if message.startswith("[") and "]: " in message else message
                text = text.replace(f"${ticker}: ", "")
                if text not in found:
                    found.append(text)
        joined = "; ".join(found)
        return joined if len(joined) <= n else joined[:n] + "..."


def _short(e: BaseException, n: int = 160) -> str:
    text = " ".join(str(e).split())  # one line: the CLI prints errors on one line
    return text if len(text) <= n else text[:n] + "..."


# --------------------------------------------------------------------------- the yfinance client


def import_yfinance(session: Any) -> Any:
    if session is not None and "yfinance" not in sys.modules:
        if isinstance(session, requests.Session):
            # See the module docstring: keep every yfinance request on `requests`. yfinance reads
            # this once, at import; setdefault leaves an explicit choice of the user alone.
            os.environ.setdefault("YF_DISABLE_CURL_CFFI", "1")
    import yfinance  # lazy: it reads YF_DISABLE_CURL_CFFI once, at import (set just above)

    return yfinance


def requests_session() -> Any:
    """A requests.Session with the browser headers of yfinance's own fallback client.

    For machines where curl_cffi can't be used; Yahoo may still rate-limit it sooner than the
    default client. Sets YF_DISABLE_CURL_CFFI=1 if yfinance is not imported yet, so that every
    request of this process goes through requests."""
    if "yfinance" not in sys.modules:
        os.environ.setdefault("YF_DISABLE_CURL_CFFI", "1")
    try:
        from yfinance import _http  # lazy: after YF_DISABLE_CURL_CFFI (see import_yfinance)
    except ImportError:  # a yfinance without the module: the same headers, written here
        _http = None
    if _http is not None and not getattr(_http, "HAS_CURL_CFFI", True):
        return _http.new_session()  # yfinance's fallback: requests with its browser headers
    session = requests.Session()  # yfinance was imported with curl_cffi: copy the same headers
    session.headers.update(
        {
            "User-Agent": getattr(
                _http,
                "_FALLBACK_USER_AGENT",
                "Mozilla/5.0 (Windows NT 10.0; Win64; x64) "
                "AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
            ),
            "Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
            "Accept-Language": "en-US,en;q=0.5",
        }
    )
    return session


def new_session() -> Any:
    """yfinance's own default session (curl_cffi when available), so we can watch it."""
    try:
        from yfinance._http import new_session as yf_new_session  # lazy: see import_yfinance
    except ImportError:  # older yfinance: plain requests works with it too
        return requests.Session()
    return yf_new_session()


@contextlib.contextmanager
def quiet_yfinance(capture: LogCapture) -> Iterator[None]:
    # yfinance logs every failed ticker at ERROR and its pandas calls raise deprecation warnings;
    # this adapter reports failures itself, with reasons taken from those records, so they go to
    # `capture` instead of the console.
    logger = logging.getLogger("yfinance")
    level, propagate = logger.level, logger.propagate
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    logger.addHandler(capture)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            warnings.filterwarnings("ignore", category=FutureWarning)
            yield
    finally:
        logger.removeHandler(capture)
        logger.setLevel(level)
        logger.propagate = propagate


def clear_request_cache(yf: Any) -> None:
    # yfinance memoises chart answers for past date ranges in memory (YfData.cache_get); a retry
    # served from there would just repeat the empty answer it is meant to replace.
    with contextlib.suppress(Exception):
        from yfinance.data import YfData  # lazy: see import_yfinance; a private module, may change

        YfData.cache_get.cache_clear()
