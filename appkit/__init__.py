"""The what-if app's logic, importable without Streamlit running (``app.py`` is a thin shell).

Modules, one concept each:

* ``appkit.design``   - the user's inputs (``Design``), uploaded model files, cluster building,
  and which widget an ``InputError`` belongs to;
* ``appkit.engines``  - adapters to the optional pieces (recommender, event engine,
  economics, launch-config exporters) that degrade to an explicit message when absent;
* ``appkit.evaluate`` - one design -> plans, the chosen plan's result, time and cost to train;
* ``appkit.charts``   - plotly figures (step-time bar, memory vs capacity, pipeline Gantt);
* ``appkit.topoview`` - a readable, aggregated drawing of the networkx topology;
* ``appkit.compare``  - up to three designs side by side with the differences marked;
* ``appkit.ui``       - the Streamlit page itself.

Dependencies point one way: ``sim`` and ``planner`` -> ``appkit`` -> ``app.py``.
"""
