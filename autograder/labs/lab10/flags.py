"""Task 1, ``serve_flags(config) -> list[str]``: an engine configuration as ``python -m miniengine serve``'s flags.
Reloaded by ``autograder.labs.lab10``.

The check parses your flags with the server's own parser (``miniengine.serving.api.launch.add_arguments``) and reads
back every EngineConfig field as the server would see it, before any plug is imported: a field the configuration sets
must read back as its value (a plug point's "module:attribute" as that string; enable_chunked_prefill True or False as
"true" or "false", which the server turns back into the bool), and every other field must keep its default.
"""
from __future__ import annotations

import argparse
import dataclasses

import autograder.notebook_checks as checks
from miniengine.config import EngineConfig
from miniengine.serving.api import launch

FIELDS = {f.name: f.default for f in dataclasses.fields(EngineConfig)}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m miniengine serve", exit_on_error=False, add_help=False)
    launch.add_arguments(p)
    return p


def as_strings(flags, what: str) -> list[str]:
    if isinstance(flags, (str, bytes)) or not isinstance(flags, (list, tuple)):
        raise AssertionError(f"{what}: serve_flags must return a list of strings, got {type(flags).__name__}")
    bad = [f for f in flags if not isinstance(f, str)]
    assert not bad, f"{what}: serve_flags returned {bad[0]!r:.40} ({type(bad[0]).__name__}), not a string"
    return [str(f) for f in flags]


def read_back(flags: list[str], what: str) -> dict:
    """Every EngineConfig field as the server's parser reads it from ``flags`` (plugs as the raw string)."""
    try:
        args, extra = parser().parse_known_args(flags)
    except (argparse.ArgumentError, SystemExit, ValueError) as e:
        raise AssertionError(f"{what}: the server refuses these flags ({e}): {flags}") from None
    assert not extra, f"{what}: the server does not know {extra[:3]} (flags: {flags})"
    out = {}
    for name in FIELDS:
        value = getattr(args, name)
        if name == "enable_chunked_prefill" and (value is None or str(value).lower() in ("true", "false")):
            value = value is not None and value.lower() == "true"  # absent: the course's default, False
        out[name] = value
    return out


def expected(config: dict) -> dict:
    """What the parser must read back for ``config``: its values, every other field at its default (the model at serve's
    own default, "target"; an absent plug as None)."""
    out = {name: (None if name in launch.PLUGS else default) for name, default in FIELDS.items()}
    out["model"], out["enable_chunked_prefill"] = "target", False
    out.update(config)
    return out


def flags_for(serve_flags, config: dict, what: str, hidden: bool = False, observe: bool = True) -> list[str]:
    """Your flags for ``config``, checked to read back as it; observes what the server read (``observe=False``: a
    configuration of this submission's own, such as its handed-in parts, which no answer sheet can know)."""
    try:
        flags = as_strings(serve_flags(dict(config)), what)
    except NotImplementedError:
        raise
    except AssertionError:
        raise
    except Exception as e:
        raise AssertionError(f"{what}: serve_flags raised {type(e).__name__}: {e}") from None
    got, want = read_back(flags, what), expected(config)
    shown = {k: v for k, v in got.items() if v != want.get(k) or k in config}
    if observe:
        checks.observe(f"{what}: the fields the server reads from your flags", {k: got[k] for k in sorted(config)},
                       **({} if hidden else {"expect": {k: want[k] for k in sorted(config)}}))
    for name in FIELDS:
        if got[name] != want[name]:
            said = "" if hidden else f", expected {want[name]!r}"
            raise AssertionError(f"{what}: the server reads {name}={got[name]!r} from your flags{said} "
                                 f"(flags: {flags}; read back: {shown})")
    return flags


def check_flags(serve_flags, configs, label: str = "", hidden: bool = False) -> int:
    """Each (what, config) of ``configs``: the flags read back as the config. ``(what, config, None)`` instead: an
    unknown field, which serve_flags must refuse with a ValueError naming it."""
    checks.require_own(serve_flags, "serve_flags")
    for case in configs:
        what, config = f"{label}{case[0]}", case[1]
        if len(case) == 3:
            bad = sorted(set(config) - set(FIELDS))[0]
            try:
                serve_flags(dict(config))
            except ValueError as e:
                named = bad in str(e)
                checks.observe(f"{what}: ValueError naming {bad}", named, expect=True)
                assert named, f"{what}: serve_flags raised ValueError, but its message does not name {bad!r}: {e}"
                continue
            except NotImplementedError:
                raise
            except Exception as e:
                raise AssertionError(f"{what}: expected a ValueError naming {bad!r}, got {type(e).__name__}: {e}") from None
            checks.observe(f"{what}: ValueError naming {bad}", False, expect=True)
            raise AssertionError(f"{what}: {bad!r} is no EngineConfig field: serve_flags must raise ValueError naming "
                                 f"it, not write a flag the server would refuse")
        flags_for(serve_flags, config, what, hidden)
    return len(configs)
