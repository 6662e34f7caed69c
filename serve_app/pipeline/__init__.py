"""The steps every billable request goes through, each in one module: the request's context
(context.py), admission (admission.py: privacy, limits beside the hold), settlement
(settlement.py: settle what was delivered, release the rest) and the answer's headers
(respond.py); runner.py runs them in one order around the request's model call."""
