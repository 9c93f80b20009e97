"""The sweep tool's bridge to Optuna (search: optuna, tools/sweep/spec.h): one command per
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
  optuna_bridge.py report --storage=URL --study=NAME --number=N --reports=JSON --pruner=median|asha
                          --min=M [--min_runs=K] [--factor=F]
      reports the trial's intermediate values ([[step, value], ...]; steps already in the study
      are skipped) and prints "prune" or "continue": Optuna's MedianPruner(n_startup_trials=K,
      n_warmup_steps=M) or SuccessiveHalvingPruner(min_resource=M, reduction_factor=F) decides

The sampler is built fresh on every ask, seeded with seed + the number of trials already in the
study: the draws are reproducible for a given history and differ from one trial to the next.
Exit status: 0 done; 2 one line "optuna_bridge: ..." on stderr (missing optuna, bad argument,
unknown sampler, storage error).
"""
import inspect
import json
import sys
import time


def fail(message):
    print("optuna_bridge: " + message, file=sys.stderr)
    sys.exit(2)


def parse(argv):
    if not argv or argv[0] not in ("check", "ask", "tell", "report"):
        fail("expected a command: check, ask, tell or report (see the top of "
             "tools/sweep/optuna_bridge.py)")
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


def retrying(opening):
    """opening(), tried again while the database answers with a transient error: sweeps that
    share a new storage race to create its tables (one gets "UNIQUE constraint failed:
    alembic_version"), and SQLite reports "database is locked" while another process writes.
    Up to 8 tries over about 9 s; other errors (a bad URL, a missing study) at once."""
    try:
        from sqlalchemy import exc
        transient = (exc.OperationalError, exc.IntegrityError)
    except ImportError:
        transient = ()
    for attempt in range(8):
        try:
            return opening()
        except transient:
            if attempt == 7:
                raise
            time.sleep(min(2.0, 0.1 * 2 ** attempt))


def load(optuna, args, create, **kwargs):
    storage, study = need(args, "storage"), need(args, "study")
    try:
        if create:
            direction = need(args, "direction")
            return retrying(lambda: optuna.create_study(
                study_name=study, storage=storage, direction=direction, load_if_exists=True,
                **kwargs))
        return retrying(lambda: optuna.load_study(study_name=study, storage=storage, **kwargs))
    except Exception as e:  # storage errors come in many types
        fail("storage " + storage + ", study " + study + ": " + str(e).splitlines()[0])


def pruner(optuna, args):
    name, low = need(args, "pruner"), int(need(args, "min"))
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=int(args.get("min_runs", "3")),
                                           n_warmup_steps=low)
    if name == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=low,
                                                      reduction_factor=int(args.get("factor", "3")))
    fail("--pruner=" + name + ": expected median or asha")


def report(optuna, args):
    name = need(args, "study")
    study = load(optuna, args, create=False, pruner=pruner(optuna, args))
    number = int(need(args, "number"))
    frozen = [t for t in study.get_trials(deepcopy=False) if t.number == number]
    if not frozen:
        fail("study " + name + " has no trial " + str(number))
    # The ask-and-tell interface gives a Trial only to the process that asked; a later process
    # reaches the same trial through its id (a documented constructor, Optuna's own route for
    # its integrations).
    trial = optuna.trial.Trial(study, frozen[0]._trial_id)
    try:
        reports = json.loads(need(args, "reports"))
    except ValueError as e:
        fail("--reports is not JSON: " + str(e))
    try:
        for step, value in reports:
            if int(step) not in frozen[0].intermediate_values:
                trial.report(float(value), int(step))
        decision = trial.should_prune()
    except Exception as e:
        fail("trial " + str(number) + ": " + str(e).splitlines()[0])
    print("prune" if decision else "continue")
    return 0


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
    if command == "report":
        return report(optuna, args)
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
