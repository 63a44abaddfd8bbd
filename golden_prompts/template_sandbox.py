"""The chat-template sandbox: a model folder's chat template is code, so its render is bounded
in time (SIGALRM) and in size (a bounded join patched into the template's compiled jinja
environment, a private transformers function: this module is the only one that touches it)."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

from specreg.core.documents import one_line

RENDER_SECONDS = 5.0
RENDER_MAX_CHARS = 1_000_000


class RenderTimeout(Exception):
    """A chat template ran past RENDER_SECONDS."""


@contextmanager
def time_limit(seconds: float):
    """Raise RenderTimeout in the block after ``seconds`` (SIGALRM: main thread only; elsewhere
    the block runs unbounded, as before)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(_signum, _frame):
        raise RenderTimeout()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def bound_output(template: str) -> None:
    """Make the render of ``template`` stop past RENDER_MAX_CHARS characters instead of building
    the whole output first: transformers compiles each chat template once (cached) in its own
    sandboxed environment, whose ``concat`` joins the rendered pieces; a bounded join replaces it.
    (One expression that builds a huge string at once, "x" * 10**10, is still Python's allocation.)"""
    if not isinstance(template, str):
        return
    from transformers.utils.chat_template_utils import _compile_jinja_template

    environment = _compile_jinja_template(template).environment
    if getattr(environment, "concat", None) is not bounded_concat:
        environment.concat = bounded_concat


def bounded_concat(pieces) -> str:
    import jinja2

    parts, total = [], 0
    for piece in pieces:
        total += len(piece)
        if total > RENDER_MAX_CHARS:
            raise jinja2.TemplateRuntimeError(f"rendered more than {RENDER_MAX_CHARS} characters")
        parts.append(piece)
    return "".join(parts)


def render_chat(tokenizer, messages: list[dict[str, str]], record_id: str, add_generation_prompt: bool = True) -> str:
    """``messages`` through ``tokenizer``'s chat template within RENDER_SECONDS and
    RENDER_MAX_CHARS; any failure of the template (an exception, a timeout, an oversized
    output) is a ``jinja2.TemplateError`` naming the tokenizer and ``record_id``."""
    import jinja2

    name = getattr(tokenizer, "name_or_path", "")
    try:
        bound_output(tokenizer.chat_template)
        with time_limit(RENDER_SECONDS):
            text = tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt
            )
    except jinja2.TemplateError:
        raise
    except RenderTimeout:
        raise jinja2.TemplateRuntimeError(
            f"chat template of {name} did not render record '{record_id}' within {RENDER_SECONDS:g} s") from None
    except Exception as exc:  # a template is user code: 1/0, range(10**9), a TypeError are its failures
        raise jinja2.TemplateRuntimeError(
            f"chat template of {name} raised {type(exc).__name__} on record '{record_id}': "
            f"{one_line(str(exc), 160)}") from None
    if not isinstance(text, str) or len(text) > RENDER_MAX_CHARS:
        size = len(text) if isinstance(text, str) else type(text).__name__
        raise jinja2.TemplateRuntimeError(
            f"chat template of {name} rendered record '{record_id}' to {size} characters, over the limit "
            f"of {RENDER_MAX_CHARS}")
    return text
