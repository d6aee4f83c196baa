"""The console's pages as Tornado templates, kept in Python so the wheel needs no data files.

The element ids and classes are the console's interface for browser tests and
for anyone scripting it (``#runs tr.run``, ``#status``, ``#entries tr.entry``,
``#redrive``, ``#confirm``): change them only together with those tests.
Values are escaped by the template (Tornado escapes ``{{ }}`` by default).
"""

from __future__ import annotations

BASE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
{% if refresh %}<meta http-equiv="refresh" content="5">{% end %}
<title>{% block title %}digest-cleanup console{% end %}</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 0 1.5em 2em; color: #222; }
nav { padding: .6em 0; border-bottom: 1px solid #ccc; margin-bottom: 1em; }
nav a { margin-right: 1.2em; } nav .user { float: right; color: #666; }
table { border-collapse: collapse; margin: .5em 0 1em; }
th, td { border-bottom: 1px solid #e4e4e4; padding: .25em .6em; text-align: left; }
td.num { text-align: right; } .refused, .bad { color: #a00; } .ok { color: #070; }
dl { display: grid; grid-template-columns: max-content auto; gap: .1em 1em; }
dt { color: #666; } dd { margin: 0; }
form { margin: .6em 0; } fieldset { border: 1px solid #ddd; }
</style></head>
<body><nav><a href="/">Runs</a><a href="/dlq">Dead letters</a>
<span class="user">{{ current_user.name }} ({{ current_user.role }})</span></nav>
<main>{% block body %}{% end %}</main></body></html>
"""

RUNS = """{% extends "base.html" %}
{% block body %}
<h1>Runs</h1>
<table id="runs"><thead><tr><th>run</th><th>status</th><th>target</th><th>expired</th>
<th>deleted</th><th>dead_lettered</th><th>skipped</th><th>batches</th><th>keys/s</th>
<th>ETA</th><th>delete rate</th><th>report</th><th>accounting</th><th>created</th></tr></thead>
<tbody>
{% for r in rows %}<tr class="run" data-run-id="{{ r['run_id'] }}">
<td><a class="run-link" href="/runs/{{ url_escape(r['run_id'], plus=False) }}">{{ r['run_id'] }}</a>
</td>
<td class="status">{{ r['status'] }}</td><td class="target">{{ r['target'] }}</td>
<td class="num expired">{{ r['expired'] }}</td><td class="num deleted">{{ r['deleted'] }}</td>
<td class="num dead_lettered">{{ r['dead_lettered'] }}</td>
<td class="num skipped">{{ r['skipped'] }}</td><td class="batches">{{ r['batches'] }}</td>
<td class="num keys-per-second">{{ r['keys_per_second'] }}</td><td class="eta">{{ r['eta'] }}</td>
<td class="delete-rate">{{ r['delete_rate'] }}</td>
<td class="report">{% if r['report_url'] %}<a class="report-link" href="{{ r['report_url'] }}">
{{ r['report_url'] }}</a>{% end %}</td>
<td class="accounting">{{ r['accounting'] }}</td><td class="created">{{ r['created_at'] }}</td></tr>
{% end %}</tbody></table>
{% if not rows %}<p id="no-runs">No runs in the run store yet.</p>{% end %}
{% end %}
"""

RUN = """{% extends "base.html" %}
{% block title %}run {{ run.run_id }}{% end %}
{% block body %}
<h1 id="run-id">{{ run.run_id }}</h1>
<p>Status <span id="status">{{ run.status }}</span>; accounting
<span id="accounting">{{ row['accounting'] }}</span>; delete rate
<span id="delete-rate">{{ row['delete_rate'] }}</span>; ETA <span id="eta">{{ row['eta'] }}</span>
</p>
<dl id="counters">{% for name, value in counters %}<dt>{{ name }}</dt>
<dd class="counter" data-counter="{{ name }}">{{ value }}</dd>{% end %}</dl>
<h2>Progress</h2>
<svg id="progress-chart" viewBox="0 0 {{ width }} {{ height }}" width="{{ width }}"
 height="{{ height }}" role="img" aria-label="keys deleted over time">
<rect x="0" y="0" width="{{ width }}" height="{{ height }}" fill="#fafafa"/>
{% if chart.empty %}<text x="20" y="{{ height // 2 }}" fill="#666">no batch recorded yet</text>
{% else %}<polyline class="done" fill="none" stroke="#bbb" stroke-width="1.5"
 points="{{ chart.done }}"/>
<polyline class="deleted" fill="none" stroke="#1a6" stroke-width="2" points="{{ chart.deleted }}"/>
<text x="4" y="20" font-size="11" fill="#666">{{ chart.top }} keys</text>
<text x="30" y="{{ height - 8 }}" font-size="11" fill="#666">{{ chart.start }}</text>
<text x="{{ width - 30 }}" y="{{ height - 8 }}" font-size="11" fill="#666" text-anchor="end">
{{ chart.end }}</text>
{% end %}</svg>
<h2>Not deleted</h2>
<table id="not-deleted"><thead><tr><th>key</th><th>code</th><th>message</th><th>where</th></tr>
</thead>
<tbody>{% for k in keys %}<tr class="key"><td class="name">{{ k['key'] }}</td>
<td class="code">{{ k['code'] }}</td><td class="message">{{ k['message'] }}</td>
<td class="where">{{ k['where'] }}</td></tr>{% end %}</tbody></table>
<p id="pages">page <span id="page">{{ page }}</span> of <span id="page-count">{{ pages }}</span>
{% if page > 1 %}<a class="page" rel="prev" href="?page={{ page - 1 }}">previous</a>{% end %}
{% if page < pages %}<a class="page" rel="next" href="?page={{ page + 1 }}">next</a>{% end %}</p>
<h2>Dead letters</h2>
{% set table_id = "dead-letters" %}{% include "entry_rows.html" %}
{% end %}
"""

ENTRY_ROWS = """<table id="{{ table_id }}"><thead><tr><th>entry</th><th>reason</th><th>codes</th>
<th>keys</th><th>attempts</th><th>last failure</th></tr></thead><tbody>
{% for e in entries %}<tr class="entry" data-entry-id="{{ e['id'] }}">
<td><a class="entry-link" href="/dlq/{{ url_escape(e['id'], plus=False) }}">{{ e['id'] }}</a></td>
<td class="reason">{{ e['reason'] }}</td><td class="codes">{{ ' '.join(e['codes']) }}</td>
<td class="num key-count">{{ e['key_count'] }}</td><td class="num attempts">{{ e['attempts'] }}</td>
<td class="last-failure">{{ e['last_failure_at'] }}</td></tr>{% end %}</tbody></table>
"""

DLQ = """{% extends "base.html" %}
{% block title %}dead letters{% end %}
{% block body %}
<h1>Dead letters</h1>
<p>Queue depth <span id="depth">{{ depth }}</span>; <span id="shown">{{ len(entries) }}</span>
 shown.</p>
<form id="dlq-filter" method="get" action="/dlq">
<label>run <input name="run" value="{{ filters['run'] }}"></label>
<label>target <input name="target" value="{{ filters['target'] }}"></label>
<label>error <input name="error" value="{{ filters['error'] }}"></label>
<button id="filter" type="submit">Filter</button></form>
{% set table_id = "entries" %}{% include "entry_rows.html" %}
{% if current_user.admin and entries %}
{% for form_id, action, button, label in actions %}
<form id="{{ form_id }}" method="get" action="{{ action }}"><fieldset>
<legend>{{ label }}</legend>
{% for name, value in filters.items() %}{% if value %}
<input type="hidden" name="{{ name }}" value="{{ value }}">{% end %}{% end %}
{% for e in entries %}<label><input type="checkbox" name="id" value="{{ e['id'] }}" checked>
{{ e['id'] }}</label> {% end %}
<button id="{{ button }}" type="submit">{{ label }}…</button></fieldset></form>
{% end %}{% end %}
{% end %}
"""

ENTRY = """{% extends "base.html" %}
{% block title %}dead letter {{ entry['id'] }}{% end %}
{% block body %}
<h1 id="entry-id">{{ entry['id'] }}</h1>
<dl id="entry">{% for name in fields %}<dt>{{ name }}</dt>
<dd class="field" data-field="{{ name }}">{% if name == 'run_id' %}<a class="run-link"
 href="/runs/{{ url_escape(entry['run_id'], plus=False) }}">{{ entry['run_id'] }}</a>{% else %}
{{ entry[name] }}{% end %}</dd>
{% end %}</dl>
<table id="keys"><thead><tr><th>key</th><th>code</th><th>message</th></tr></thead><tbody>
{% for k in entry['keys'] %}<tr class="key"><td class="name">{{ k['key'] }}</td>
<td class="code">{{ k['code'] }}</td><td class="message">{{ k['message'] }}</td></tr>{% end %}
</tbody></table>
{% end %}
"""

CONFIRM = """{% extends "base.html" %}
{% block title %}{{ verb }}{% end %}
{% block body %}
<h1>{{ title }}</h1>
{% if action == "redrive" %}
<p>Would redrive <span id="would-redrive-count">{{ len(result.movable) }}</span> entries
(<span id="would-redrive-keys">{{ result.keys }}</span> keys):</p>
<ul id="would-redrive">{% for entry_id in result.movable %}
<li class="entry" data-entry-id="{{ entry_id }}">{{ entry_id }}</li>{% end %}</ul>
<p>Would refuse (they stay in the queue):</p>
<ul id="would-refuse">{% for r in result.refused %}
<li class="refused" data-entry-id="{{ r.entry_id }}">
{{ r.entry_id }} <span class="reason">{{ r.reason }}</span>: <span class="message">{{ r.message }}
</span></li>{% end %}</ul>
{% else %}
<p>Purge drops <span id="purge-count">{{ len(entries) }}</span> entries
(<span id="purge-keys">{{ sum(e.key_count for e in entries) }}</span> keys) for good, leaving
an audit record of each:</p>
<ul id="would-purge">{% for e in entries %}<li class="entry" data-entry-id="{{ e.id }}">{{ e.id }}
</li>{% end %}</ul>
{% end %}
<form id="confirm-{{ action }}" method="post" action="/dlq/{{ action }}">
{% module xsrf_form_html() %}
{% for e in entries %}<input type="hidden" name="id" value="{{ e.id }}">{% end %}
<button id="confirm" type="submit">{{ verb }} {{ len(entries) }} entries</button>
<a id="cancel" href="/dlq">cancel</a></form>
{% end %}
"""

REDRIVE_RESULT = """{% extends "base.html" %}
{% block title %}redriven{% end %}
{% block body %}
<h1>Redrive</h1>
<div id="redrive-result">
<p>Redrove <span id="redriven-count">{{ len(result.movable) }}</span> entries
(<span id="redriven-keys">{{ result.keys }}</span> keys):</p>
<ul id="redriven">{% for entry_id in result.movable %}
<li class="entry" data-entry-id="{{ entry_id }}">{{ entry_id }}</li>{% end %}</ul>
<p>Refused <span id="refused-count">{{ len(result.refused) }}</span> (they stay in the queue):</p>
<ul id="refused">{% for r in result.refused %}<li class="refused" data-entry-id="{{ r.entry_id }}">
{{ r.entry_id }} <span class="reason">{{ r.reason }}</span>: <span class="message">{{ r.message }}
</span></li>{% end %}</ul>
</div>
<p>{% for run_id in runs %}<a class="run-link" href="/runs/{{ url_escape(run_id, plus=False) }}">run
 {{ run_id }}</a> {% end %}
<a href="/dlq">dead letters</a></p>
{% end %}
"""

PURGE_RESULT = """{% extends "base.html" %}
{% block title %}purged{% end %}
{% block body %}
<h1>Purge</h1>
<div id="purge-result">
<p>Purged <span id="purged-count">{{ len(result.purged) }}</span> entries; audit records written to
<span id="audit">{{ where }}</span>.</p>
<ul id="purged">{% for entry_id in result.purged %}<li class="entry" data-entry-id="{{ entry_id }}">
{{ entry_id }}</li>{% end %}</ul>
</div>
<p><a href="/dlq">dead letters</a></p>
{% end %}
"""

ERROR = """{% extends "base.html" %}
{% block title %}{{ status }}{% end %}
{% block body %}
<h1 id="error">{{ status }} {{ reason }}</h1>
<p id="error-message">{{ message }}</p>
{% end %}
"""

#: Every page by the name the handlers render it under.
TEMPLATES = {
    "base.html": BASE,
    "runs.html": RUNS,
    "run.html": RUN,
    "entry_rows.html": ENTRY_ROWS,
    "dlq.html": DLQ,
    "entry.html": ENTRY,
    "confirm.html": CONFIRM,
    "redrive_result.html": REDRIVE_RESULT,
    "purge_result.html": PURGE_RESULT,
    "error.html": ERROR,
}
