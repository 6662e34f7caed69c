"""HTTP routers, one per resource. Routes parse, call one service function, and answer."""
