"""The random-history checker (issue 52): the cache's promise, tested on generated histories.

The promise: whatever happened before, an artifact the engine serves as current is exactly
what a clean build of today's code and config would make, and nothing a current plan serves
is ever deleted. docs/caching.md ("What a served artifact may differ in") lists the only
exceptions; docs/reliability.md ("The random-history checker") says how to run it.

How it works, module by module:

- ``pipeline``: a generated pipeline (5-8 steps: chain, diamond, fan-in, random DAG) as data,
  and as a real Python file whose steps' ``fn`` are deterministic in their config, a code
  revision constant and their inputs' bytes (code edits are real source edits);
- ``ops``: the operation table (edits of code and config, a config key's type among them,
  runs under every policy, failures, killed drivers, crash points, two drivers, a sweep
  stream, gc, planted and torn files, hand damage, a remote job preempted, a user's data at an
  output path beside a metadata folder no attempt left, which ``userdata`` puts, moves and
  checks): one dataclass per operation, with its weight, its random arguments and what it
  does; remote steps may be gangs of two ranks (``history.GANG``), whose operations (a rank
  that raises, a lost lease) ``gangs`` runs and checks;
- ``choose`` and ``history``: one generator of histories, fed by ``random.Random(seed)``
  (fixed-seed history N) or by hypothesis (which shrinks);
- ``world`` and ``executor``: a history's sandbox (prefix, control files, counter, bystander
  files outside the prefix), ``marin`` in this process or as a subprocess, and the checks
  after every operation (``checks``) against the ``oracle``'s clean builds;
- ``script``: a history as a runnable Python script, the failure report; ``shrink``: a
  shorter fixed-seed history that still fails; ``tally``: many seeds, counted per kind;
- ``pinned``: the shrunk histories of every bug the checker found, replayed on every run;
  ``repros/``: their scripts as found on e8e6702 (``python repros/<name>.repro``; rewritten
  by ``python -m tests.oracle.tally --pinned tests/oracle/repros``);
- ``engines``: the same histories' runs on the compiled Prefect flow and ``airflow dags test``.

Tests, three files so that two pytest-xdist workers share them (``subsets.py``):
``test_histories.py``, the fast subset (120 fixed-seed histories, one test per kind of
violation), the oracle's own checks and ``soak`` (5,000 histories and hypothesis's own
generation and shrinking; deselected unless ``-m soak``); ``test_histories_remote.py``, 8 gang
histories (gangs, preempted jobs), 20 adoption histories and the pinned histories;
``test_histories_engines.py``, ``slow`` (Prefect and Airflow).
"""
