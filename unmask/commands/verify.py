"""``unmask verify``: check every lemma on random and adversarial instances of a region."""

from __future__ import annotations

HELP = "check every lemma's constant on random and adversarial instances"


def add_arguments(p):
    p.add_argument("--instances", type=int, default=32, help="random instances per lemma (default 32)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--region", default="d=4,n=8,heads=2,R=1,omega=2,mu=0.5,gamma=1,gamma_max=2",
                   help="comma-separated key=value of proofs_check.region.Region (default: the demo family)")
    p.add_argument("--variant", choices=["attention", "output"], default=None, help="shortcut for variant=...")
    p.add_argument("--starts", type=int, default=8, help="adversarial starts per lemma")
    p.add_argument("--steps", type=int, default=60, help="adversarial ascent steps")
    p.add_argument("--json", help="write the report as JSON (atomically)")
    p.add_argument("--counterexamples", default=".", help="directory for counterexample npz files")
    p.add_argument("--rigorous", action="store_true", help="also certify lambda_min >= l on a box with ball arithmetic")


def parse_region(text: str, variant: str | None):
    from proofs_check.region import Region
    from solver.errors import InvalidRegionError

    kw = {}
    for part in filter(None, text.split(",")):
        if "=" not in part:
            raise InvalidRegionError(f"--region: {part!r} is not key=value")
        k, v = part.split("=", 1)
        k = k.strip()
        if k not in Region.__dataclass_fields__:
            raise InvalidRegionError(f"--region: unknown key {k!r}; known: {', '.join(Region.__dataclass_fields__)}")
        kw[k] = v.strip() if k == "variant" else (int(v) if k in ("d", "n", "heads", "d_v") else float(v))
    if variant:
        kw["variant"] = variant
    if kw.get("variant") == "output":
        kw.setdefault("d_v", 2)
        kw.setdefault("omega_V", 1.0)
        kw.setdefault("beta", 1.0)
    return Region(**kw)


def run(args) -> int:
    from proofs_check.checker import check
    from solver.io import atomic_write_json

    region = parse_region(args.region, args.variant)
    report = check(region, instances=args.instances, seed=args.seed, starts=args.starts, steps=args.steps,
                   counterexample_dir=args.counterexamples)
    print(f"region: {region.as_dict()}")
    print(report.table())
    out = report.as_dict()
    if args.rigorous:
        from proofs_check.rigorous import certify_box

        box = certify_box(seed=args.seed)
        out["rigorous"] = box
        print(f"rigorous: {box['summary']}")
    for r in report.lemmas:
        if r.status == "VIOLATED":
            print(f"VIOLATION: {r.name}: worst ratio {max(r.worst_random_ratio, r.worst_adversarial_ratio):.4f} > 1; "
                  f"counterexample saved to {r.counterexample}")
    if args.json:
        atomic_write_json(args.json, out)
    print(f"{len(report.lemmas)} lemmas checked in {report.seconds:.1f} s: {'all OK' if report.ok else 'VIOLATIONS'}")
    ok = report.ok and (not args.rigorous or out["rigorous"]["certified"])
    return 0 if ok else 1
