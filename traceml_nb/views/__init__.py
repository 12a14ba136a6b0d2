"""What the user sees: the live views while a cell runs and the final report after it.

* :mod:`.frontend`: which frontend this is (Jupyter, Colab, Kaggle, terminal) and which
  live view suits it;
* :mod:`.live`: the views while the cell runs, the Bokeh charts (an ipywidget, one writer
  thread) and the fallback, one HTML output updated in place;
* :mod:`.report` and :mod:`.text`: the static end-of-run report, as HTML with an inline SVG
  chart and as plain text.

Nothing is imported here, so that ``import traceml_nb`` stays free of IPython and Bokeh.
"""
