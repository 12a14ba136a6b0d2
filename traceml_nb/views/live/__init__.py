"""The views while a run goes on: the Bokeh widget (:mod:`.view`, its models in :mod:`.charts`,
its points in :mod:`.data`), the HTML display-handle view (:mod:`.handle`), the header's verdict
(:mod:`.verdict`) and the ranks' lines and figures (:mod:`.rank_lines`, :mod:`.rank_figures`)."""
