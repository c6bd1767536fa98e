"""The engines and the entry points: the analytic engine, the event engine (event/), DataParallel and parameter-server pricing, the step result, run resolution and simulate."""
