"""The web console: an ASGI app (Starlette) over the public API, read-only by default.

Install the ``web`` extra (``pip install 'durabilis[web]'``) and either mount it
inside your gateway::

    from starlette.routing import Mount
    from durabilis.web import create_app

    routes = [Mount("/durabilis", app=create_app("redis://...", namespace="durabilis"))]

or serve it alone: ``durabilis web --url redis://... --namespace durabilis``
(docs/console.md).

Routes and ``data-testid`` contract
-----------------------------------
Paths are relative to where the app is mounted (every link and form action is
built with ``request.url_for``, so it works under any prefix). Route names (for
``url_for``) are in brackets. This list is the contract with the browser tests:
keep it in sync with the templates (``tests/integration/test_web.py`` checks that
the testids named here appear on their pages).

Every HTML page:
    ``nav`` (the navigation bar) with links ``nav-overview``, ``nav-dlq``,
    ``nav-breakers``, ``nav-checkpoints``, ``nav-inflight``, ``nav-config``;
    ``page-title`` (the ``<h1>``); ``namespace`` (the namespace shown);
    ``mode`` (text ``read-only`` or ``actions enabled``).
    Errors (404, 403, 400) render ``error-page`` with ``error-message``; the
    HTTP status is the error's.

``GET /`` [overview]: the fleet's counters.
    ``overview-totals`` (table of the cumulative counters: rows
    ``total-started``, ``total-succeeded``, ``total-retries``, ``total-parked``,
    ``total-in-flight``, ``total-dlq-backlog``); charts, each a ``<figure>``
    holding one inline ``<svg>``: ``chart-started``, ``chart-succeeded``,
    ``chart-retried``, ``chart-parked`` (per second), ``chart-in-flight``,
    ``chart-dlq-backlog`` (levels). ``history-samples`` (how many samples the
    charts hold). Each load of the page takes one sample (shared history in
    Redis, capped), so the charts fill as the page is reloaded.

``GET /dlq`` [dlq_list]: records, oldest first, with filters (query string).
    Filter form ``dlq-filters`` (GET) with fields (name = query parameter):
    ``status`` (``pending`` default, ``requeued``, ``replayed``, ``abandoned``,
    ``all``; testid ``filter-status``), ``operation_type``
    (``filter-operation-type``), ``reason`` (``filter-reason``: prefix of the
    original or last error: code or exception type), ``agent`` (``filter-agent``),
    ``older_than`` (``filter-older-than``: ``90s``, ``15m``, ``2h``, ``7d``),
    submit ``filter-submit``. Also ``limit`` (page size, 1..200, default 50)
    and ``after`` (cursor: the ``stream_id`` of the last record of the
    previous page). ``dlq-summary`` (pending count), ``dlq-table`` with one
    ``dlq-row`` per record (attribute ``data-dlq-id``), in it ``dlq-link`` (to
    the record), ``dlq-status``, ``dlq-operation-type``, ``dlq-agent``,
    ``dlq-error`` (redacted). ``dlq-empty`` when the page has no record.
    ``dlq-next`` (link to the next page) when there may be more;
    ``dlq-scan-note`` when the page stopped at its scan bound (index or stream
    entries looked at, expired records' included) before filling.
    With actions on: ``action-requeue-many`` and ``action-purge`` (links to the
    confirmation pages of ``/dlq-bulk/requeue`` and ``/dlq-bulk/purge`` for the
    current filter).

``GET /dlq/{dlq_id}`` [dlq_record]: one record's whole history.
    ``dlq-record`` (table) whose body is ``record-fields`` (one row per
    field, each ``field-<name>``, e.g.
    ``field-status``, ``field-agent_id``, ``field-last_error``),
    ``record-metadata``, ``record-operation`` (the payload; with redaction on,
    the text ``hidden``: see ``create_app(redact=...)``), ``record-history``
    (table of the DLQ log stream's entries of this record, NEWEST first:
    ``history-row`` each, with ``history-change`` and ``history-by``);
    ``history-truncated`` when the read stopped at its bound before reaching
    the record's parking (the oldest entries are then not shown).
    With actions on: ``action-requeue``, ``action-abandon``, ``action-purge-one``
    (links to the confirmation pages). 404 ``error-page`` for an unknown id.

``GET /breakers`` [breakers]: ``breakers-table``, one ``breaker-row`` per
    breaker (attribute ``data-breaker``), with ``breaker-link``,
    ``breaker-state``, ``breaker-failure-rate``, ``breaker-window``
    (results in the window / window size), ``breaker-probes`` (probes in
    flight / permits). ``breakers-empty`` when none; ``breakers-more`` when
    more breakers exist than the page lists (at most 500).

``GET /breakers/{name}`` [breaker]: ``breaker-detail`` (table: state, rates,
    window, probes, retry after, config), ``breaker-timeline`` (a ``<figure>``
    with an inline ``<svg>``: the state over time from its transitions),
    ``breaker-transitions`` (table, oldest first, ``transition-row`` each).
    404 for a breaker neither configured nor found in Redis.

``GET /checkpoints`` [checkpoints]: lookup form ``checkpoint-lookup`` (GET;
    field ``task_id``: testid ``lookup-task-id``; optional ``agent``:
    ``lookup-agent``; submit ``lookup-submit``), which leads to:
``GET /checkpoints/{task_id}`` [checkpoint_task] (``?agent=`` optional):
    ``checkpoint-table`` (the task's current checkpoints, ``checkpoint-row``
    each with attribute ``data-checkpoint-id``), ``checkpoint-lineage`` (per
    agent, the lineage of its newest checkpoint: ``lineage-row`` each, newest
    first), ``checkpoint-state`` cells show ``hidden`` with redaction on.
    ``checkpoints-empty`` when the task has no live checkpoint.

``GET /inflight`` [inflight]: ``inflight-counts`` (in flight, lease ended),
    ``inflight-table`` (``inflight-row`` each: claims in flight, key and lease
    end), ``orphans-table`` (``orphan-row`` each: claims whose lease ended,
    awaiting recovery), ``inflight-empty`` / ``orphans-empty`` when none.

``GET /config`` [config]: ``config-version``, ``config-updated``,
    ``config-retry`` (table, ``config-retry-row`` each), ``config-breakers``
    (table, ``config-breaker-row`` each), ``config-rejected`` (when any),
    ``config-local`` (this process's effective config, JSON).

``GET /static/console.css`` [static]: the stylesheet (the only asset; no script).

Actions (only with ``create_app(actions=True, authorize=...)`` and the hook
returning an actor name; otherwise every route below answers 403 with
``error-page`` and does nothing, the confirmation pages included):

``GET|POST /dlq/{dlq_id}/requeue``, ``/dlq/{dlq_id}/abandon``, ``/dlq/{dlq_id}/purge``
    [dlq_action, params ``dlq_id``, ``action``]: one record.
``GET|POST /dlq-bulk/requeue``, ``/dlq-bulk/purge`` [dlq_bulk, param ``action``]:
    the records a filter selects (the filter as in ``/dlq``: in the query string
    of the GET, as hidden fields of the POST; at most 500 per confirmation).
    The confirmation lists every record selected (``confirm-row`` each, with
    attribute ``data-dlq-id``) and freezes them: its form carries their ids
    (``dlq_ids``) and their signature (``selection``, bound to the CSRF token
    and the action); the POST acts on exactly those (another list: 403,
    nothing done), each re-checked by the DLQ, and its result says how many
    were skipped because they changed (``action-skipped``).
    HEAD on any action route: 405 (the hook is not asked).

    GET is the confirmation page: ``confirm-summary`` (with ``confirm-count``
    for a filter: how many records it selects, ``+`` when there may be more),
    ``confirm-form`` (POST to the same path) with a hidden ``csrf_token``
    field and the button ``confirm-button``; ``confirm-cancel`` links back.
    POST (form-encoded; ``csrf_token`` must be the signature of this
    browser's ``durabilis_csrf`` cookie, which the confirmation page sets)
    does it and renders ``action-result`` with one ``action-outcome`` per
    record (``requeued``, ``already``, ``final``, ``not_found``,
    ``abandoned``, ``not abandoned``, ``purged``, ``busy``, ``other:<status>``).
    A POST with a missing or wrong token answers 403 ``error-page`` and does
    nothing. Each change is written to the DLQ's log stream with the actor
    the hook named (``by``), shown in the record page's ``history-by``.
"""

from __future__ import annotations

from durabilis.web._app import BulkTarget, ConsoleSettings, create_app

__all__ = ["BulkTarget", "ConsoleSettings", "create_app"]
