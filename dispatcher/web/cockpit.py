"""The operator's cockpit: the routes of the history and search pages.

Charts (:mod:`dispatcher.web.charts`), the run timeline (:mod:`dispatcher.web.timeline`) and
card search with bulk actions (:mod:`dispatcher.web.search`) keep their routes here, so the
application's route list (:mod:`dispatcher.web.app`) names them in one line.
"""

from __future__ import annotations

from starlette.routing import BaseRoute, Route

from dispatcher.web import charts, search, timeline


def routes() -> list[BaseRoute]:
    """The cockpit's routes."""
    return [
        Route("/charts", charts.charts),
        Route("/charts/runs", charts.bar_runs),
        Route("/charts/fires", charts.bar_fires),
        Route("/timeline", timeline.timeline),
        Route("/search", search.search),
        Route("/search/act", search.act, methods=["POST"]),
    ]
