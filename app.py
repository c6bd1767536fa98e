"""Streamlit what-if app: `streamlit run app.py` (docs/app.md).

Thin shell; the logic lives in the ``appkit`` package so tests can import it.
"""

from appkit.ui import main

main()
