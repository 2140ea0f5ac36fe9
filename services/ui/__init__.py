"""``reel ui``: a web app over a namespace's runs (docs/ui.md), read-only unless ``--allow-actions``.

:mod:`~reel.services.ui.reader` reads (event log, blobs, live commits; never a command),
:mod:`~reel.services.ui.actions` sends the operator's commands as the CLI does and :mod:`~reel.services.ui.forms`
checks and routes their form posts (both only with ``--allow-actions``),
:mod:`~reel.services.ui.pages` and :mod:`~reel.services.ui.runview` shape what the pages show (pure),
:mod:`~reel.services.ui.app` is the Starlette app (Jinja2 templates, server-sent events) and its
uvicorn server; ``templates/`` and ``static/`` are its pages and their small script.
"""
