"""The web console at ``/console``: the control plane's own pages over its API (docs/console.md).

``app.mount_console`` mounts it on the API application; the modules each hold one job: sessions
and CSRF (sessions.py, web.py), the API client (api_client.py), statistics (stats.py), charts
(charts.py), pages (pages.py), actions (actions.py), the playground (playground.py) and its
streaming chat for LLM endpoints (chat.py).
"""
