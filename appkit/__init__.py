"""The what-if app's logic (``app.py`` is a thin shell; docs/app.md).

Modules, one concept each:

* ``appkit.design``   - the user's inputs (``Design``), uploaded model files, cluster building,
  and which widget an ``InputError`` belongs to;
* ``appkit.engines``  - adapters to the recommender, the event engine, economics and the
  launch-config exporters;
* ``appkit.evaluate`` - one design -> plans, the chosen plan's result, time and cost to train;
* ``appkit.jobs``     - searches in background threads, their stages, results kept per design;
* ``appkit.links``    - a design in the page's address (an uploaded file, refused values);
* ``appkit.present``  - how a plan reads: the plans table, the verdict, bands, the cluster as built;
* ``appkit.charts``   - plotly figures (step-time bar, memory vs capacity, pipeline Gantt);
* ``appkit.topoview`` - a readable, aggregated drawing of the networkx topology;
* ``appkit.compare``  - up to three designs side by side with the differences marked;
* ``appkit.sidebar``, ``appkit.view``, ``appkit.tabs``, ``appkit.ui`` - the Streamlit page
  (inputs; shared pieces and the headline; the result tabs; Run, progress and layout).

Dependencies point one way: ``sim`` and ``planner`` -> ``appkit`` -> ``app.py``.
"""
