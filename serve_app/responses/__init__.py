"""Background responses (`/responses` with `background: true`): generations that outlive the
connection that asked for them, their numbered events kept for resuming, bounded and expiring.

- `store.py`: the `stored_responses` table (the object as it stands, its owner, its lease);
- `events.py`: the numbered events (Redis where configured, else the database);
- `service.py`: the worker that drives a generation detached from its request, and what the
  routes ask of it (retrieve, resume, cancel, delete), plus the sweep.
"""
