"""The sweep tool's bridge to Optuna (search: optuna, tools/sweep/sweep_spec.h): one command per
call, so that the C++ sweep keeps no Python state and every decision is in Optuna's storage.

  optuna_bridge.py check --sampler=NAME
      prints the Optuna version; exit 2 with one line when optuna is missing or NAME is not one
      of optuna.samplers' samplers
  optuna_bridge.py ask --storage=URL --study=NAME --direction=maximize|minimize --sampler=NAME
                       --seed=N --space=JSON
      creates the study when it does not exist (load_if_exists), asks for one trial over SPACE
      ([[key, {"kind": "uniform"|"loguniform"|"int"|"choice", "low", "high", "values"}], ...])
      and prints {"number": N, "params": {key: value}} on one line
  optuna_bridge.py tell --storage=URL --study=NAME --number=N (--value=V | --state=pruned|fail)

The sampler is built fresh on every ask, seeded with seed + the number of trials already in the
study: the draws are reproducible for a given history and differ from one trial to the next.
Exit status: 0 done; 2 one line "optuna_bridge: ..." on stderr (missing optuna, bad argument,
unknown sampler, storage error).
"""
import inspect
import json
import sys


def fail(message):
    print("optuna_bridge: " + message, file=sys.stderr)
    sys.exit(2)


def parse(argv):
    if not argv or argv[0] not in ("check", "ask", "tell"):
        fail("expected a command: check, ask or tell (see the top of tools/optuna_bridge.py)")
    args = {}
    for a in argv[1:]:
        if not a.startswith("--") or "=" not in a:
            fail("bad argument '" + a + "': expected --name=value")
        name, value = a[2:].split("=", 1)
        args[name] = value
    return argv[0], args


def need(args, name):
    if name not in args:
        fail("missing --" + name + "=")
    return args[name]


def import_optuna():
    try:
        import optuna
    except ImportError:
        fail("search: optuna needs the Python package optuna: pip install optuna (tools/setup.sh "
             "installs it from tools/requirements.txt)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def sampler_class(optuna, name):
    names = sorted(n for n in dir(optuna.samplers)
                   if n.endswith("Sampler") and not n.startswith("Base") and n not in
                   ("GridSampler", "PartialFixedSampler"))
    if name not in names:
        fail("sampler: '" + name + "' is not one of Optuna's samplers (" + ", ".join(names) + ")")
    return getattr(optuna.samplers, name)


def load(optuna, args, create):
    storage, study = need(args, "storage"), need(args, "study")
    try:
        if create:
            direction = need(args, "direction")
            return optuna.create_study(study_name=study, storage=storage, direction=direction,
                                       load_if_exists=True)
        return optuna.load_study(study_name=study, storage=storage)
    except Exception as e:  # storage errors come in many types
        fail("storage " + storage + ", study " + study + ": " + str(e).splitlines()[0])


def distribution(optuna, spec):
    d = optuna.distributions
    kind = spec["kind"]
    if kind == "uniform":
        return d.FloatDistribution(spec["low"], spec["high"])
    if kind == "loguniform":
        return d.FloatDistribution(spec["low"], spec["high"], log=True)
    if kind == "int":
        return d.IntDistribution(int(spec["low"]), int(spec["high"]))
    if kind == "choice":
        return d.CategoricalDistribution(spec["values"])
    fail("unknown distribution kind '" + kind + "'")


def main(argv):
    command, args = parse(argv)
    optuna = import_optuna()
    if command == "check":
        sampler_class(optuna, need(args, "sampler"))
        print(optuna.__version__)
        return 0
    if command == "ask":
        cls = sampler_class(optuna, need(args, "sampler"))
        study = load(optuna, args, create=True)
        seed = int(args.get("seed", "0")) + len(study.trials)
        kwargs = {"seed": seed} if "seed" in inspect.signature(cls).parameters else {}
        study.sampler = cls(**kwargs)
        try:
            space = json.loads(need(args, "space"))
        except ValueError as e:
            fail("--space is not JSON: " + str(e))
        trial = study.ask({key: distribution(optuna, spec) for key, spec in space})
        print(json.dumps({"number": trial.number, "params": trial.params}))
        return 0
    study = load(optuna, args, create=False)
    number = int(need(args, "number"))
    if "value" in args:
        study.tell(number, float(args["value"]))
    else:
        states = {"pruned": optuna.trial.TrialState.PRUNED, "fail": optuna.trial.TrialState.FAIL}
        state = need(args, "state")
        if state not in states:
            fail("--state=" + state + ": expected pruned or fail")
        study.tell(number, state=states[state])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
