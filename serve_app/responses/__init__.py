"""Background responses (`/responses` with `background: true`): generations that outlive the
connection that asked for them, their numbered events kept for resuming, bounded and expiring.

- `store.py`: the `stored_responses` table (the object as it stands, its owner, its lease);
- `events.py`: the numbered events (Redis where configured, else the database);
- `progress.py`: what a worker saw of its events (the next number, the object cut short);
- `drive.py`: the worker that drives one generation detached from its request;
- `follow.py`: reading the events as they come, on any replica;
- `sweep.py`: the upkeep (responses whose worker died, ended ones past their keeping time);
- `service.py`: what the routes ask (create, retrieve, resume, cancel, delete) on those parts.
"""
