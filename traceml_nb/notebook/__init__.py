"""The notebook's side: running a cell as IPython would (:mod:`.cell`), the ``%%traceml`` cell
magic (:mod:`.magic`) and the ``%traceml`` line commands (:mod:`.line_commands`). IPython is
imported only here, when ``%load_ext traceml_nb`` asks for it."""
