"""Offline what-ifs: spot traces replayed through the controller's own planner.

`spotrun simulate` answers what a recipe costs and how long it takes on spot, before spending a
cent. The modules, in the order a run uses them:

- `traces`: capacity traces (the spot-traces format, seeded generators, replay events);
- `figures`: what spotrun's moves cost (`Figures`), recorded by the benches in
  `$SPOTRUN_HOME/bench-figures.json`;
- `engine`: the event-driven world (zones, provider, training job) the policies act in;
- `policies`: `run_simulation` / `simulate`, which run spotrun, relaunch-all, checkpoint-restart
  and on-demand on the same traces;
- `results`: what they return (`SimulationResult`, `PolicyResult`, `Sample`);
- `report`: the table, JSON and charts of a result.

The package imports none of them: `traces` is on the CLI and controller paths and stays
standard-library only.
"""
