"""The ``unmask`` command line.

Each subcommand is a module ``unmask.commands.<name>`` that defines
``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
Modules are imported only when their command runs, so ``unmask derive``
does not pay for JAX start-up and a missing optional extra only affects
the command that needs it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "demo": "plant an instance, derive, check, recover and certify it",
    "derive": "derive the loss symbolically and (re)generate the JAX code",
    "verify": "check every lemma's constant on random and adversarial instances",
    "recover": "recover X from attention weights W and attention maps B",
    "recheck": "re-check a certificate of `unmask recover` independently (exit 0 accepted, 1 not, 2 bad input)",
    "attack": "recover the text fed into a real pretrained model from its attention",
    "sipit": "recover a prompt from the hidden states of a causal LM (SipIt)",
    "collisions": "minimum distance between the hidden states of many prompts",
}


def _module(name: str):
    return importlib.import_module(f"unmask.commands.{name}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="unmask", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        try:
            mod = _module(name)
        except ModuleNotFoundError as exc:
            if exc.name != f"unmask.commands.{name}":
                raise
            p.set_defaults(_missing=name)
            continue
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "_missing", None):
        print(f"unmask {args._missing}: not available in this build", file=sys.stderr)
        return 2
    from solver.errors import UnmaskError

    try:
        return int(args._run(args) or 0)
    except UnmaskError as exc:
        print(f"unmask {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"unmask {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`unmask ... | head`): stop quietly, as a Unix filter does; point stdout at
        # devnull so the interpreter's final flush does not raise again
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def entry() -> int:
    """The ``unmask`` console script: `main` after `solver.memory.keep_freed_memory` (glibc malloc keeps the
    memory NumPy frees, instead of the kernel zeroing it again on the next large temporary;
    ``UNMASK_KEEP_FREED_MEMORY=0`` turns it off). `main` itself leaves the allocator alone, for callers
    that run it in their own process (tests, notebooks)."""
    from solver.memory import keep_freed_memory

    keep_freed_memory()
    return main()


if __name__ == "__main__":
    sys.exit(entry())
