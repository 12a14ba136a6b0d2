"""What measures a run: the engine and everything it drives.

In the order data flows: the shared words (:mod:`.contracts`), what could be measured
(:mod:`.capabilities`), the columnar record (:mod:`.record`) and the events the instruments log
(:mod:`.events`); the training thread's side (:mod:`.instrument`) and the samplers
(:mod:`.sampling`); the step segmenter (:mod:`.segment`); :class:`~.run.Run`, which installs
them and always removes them, and the ranks a run launches (:mod:`.rank_launch`). Nothing here
imports the analysis, the session or the views. This package re-exports nothing: import the
module you need.
"""
