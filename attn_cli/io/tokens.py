"""A text's tokens from the checkpoint's tokenizer.json (the ``tokenizers`` package), bounded:
at most MAX_TEXT_CHARS characters, tokenised within TOKENIZE_SECONDS (tokenizer.json's regexes
may backtrack), and a Rust panic in the package one InputError."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from attn_cli.errors import InputError
from attn_cli.io import gate
from attn_cli.io.weights import MAX_JSON_BYTES, first_line, is_panic, require

MAX_TEXT_CHARS = 65_536  # --text: a teaching trace, not a book; its tokenizer's time grows with it


TOKENIZE_SECONDS = 5.0  # tokenizer.json's regexes backtrack (Oniguruma): its work is timed


def encode_text(path: Path, text: str) -> tuple[list[int], list[str], list[int]]:
    """Token ids, strings and type ids of ``text`` from the checkpoint's own tokenizer.json."""
    tokenizers = require("tokenizers")
    what = "the checkpoint's tokenizer.json (for the text)"
    raw = gate.read_bytes(path, str(path), what, max_bytes=MAX_JSON_BYTES)
    try:
        spec = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(str(path), "", f"is not UTF-8 ({e})", "a tokenizer.json") from None

    def load() -> Any:
        tokenizer = tokenizers.Tokenizer.from_str(spec)
        tokenizer.no_padding()  # tokenizer.json may pad to a fixed length (MiniLM pads to 128)
        tokenizer.no_truncation()  # too many tokens is an error below, not a silent cut
        return tokenizer

    tokenizer = tokenizer_call(path, load, "unreadable tokenizer", "a tokenizer.json")
    encoding = _tokenize(path, tokenizer, text)
    if not encoding.ids:
        raise InputError(str(path), "text", "the text gives no tokens", "some text", option="text")
    return list(encoding.ids), list(encoding.tokens), list(encoding.type_ids)


def _tokenize(path: Path, tokenizer: Any, text: str) -> Any:
    """``text``'s encoding, special tokens as the model's post-processor adds them, computed
    within TOKENIZE_SECONDS: a regex of tokenizer.json may backtrack for minutes.

    ``encode_batch`` releases the GIL (``encode`` does not), so this thread waits on a worker
    and gives up in time; the worker, which nothing can stop, ends with the process.
    """
    import threading

    box: list[Any] = []

    def work() -> None:
        box.append(tokenizer_call(path, lambda: tokenizer.encode_batch([text])[0], *failed))

    failed = ("its tokenizer fails on the text", "a tokenizer.json that tokenizes the text")
    worker = threading.Thread(target=lambda: _hand_over(work, box), name="attn-tokenize")
    worker.daemon = True
    with _rust_panics_unprinted():
        worker.start()
        worker.join(TOKENIZE_SECONDS)
    if not box:
        raise InputError(
            str(path),
            "",
            f"tokenizing the text takes more than {TOKENIZE_SECONDS:g} s (a "
            "regex of its normalizer or pre-tokenizer backtracks)",
            "a tokenizer.json whose regexes run in linear time, or a shorter text",
            option="text",
        )
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def _hand_over(work: Callable[[], None], box: list[Any]) -> None:
    """Run ``work`` in a worker thread; what it raises goes to ``box`` for the waiting thread."""
    try:
        work()
    except BaseException as e:  # the waiting thread raises it again
        box.append(e)


def tokenizer_call(path: Path, work: Callable[[], Any], what: str, expected: str) -> Any:
    """``work()``, whose exceptions and Rust panics (the tokenizers package raises plain
    Exception, and panics on a regex that runs out of its backtracking limit) are one line."""
    try:
        return work()
    except BaseException as e:
        if not (isinstance(e, Exception) or is_panic(e)):
            raise  # KeyboardInterrupt, SystemExit
        raise InputError(str(path), "", f"{what} ({first_line(e)})", expected) from None


@contextmanager
def _rust_panics_unprinted() -> Iterator[None]:
    """Standard error's file descriptor sent to /dev/null meanwhile: Rust's panic hook writes
    its message there, and attn says what went wrong in one ``Error:`` line instead."""
    try:
        saved = os.dup(2)
    except OSError:  # no standard error: nothing to keep clean
        yield
        return
    try:
        if sys.stderr is not None:
            sys.stderr.flush()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
