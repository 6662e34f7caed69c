"""The steps every billable request goes through, each in one module: the request's context
(context.py), admission (admission.py: privacy, limits beside the hold), the request's bill
(bill.py: the hold, what was delivered, settled or released once) and the answer's headers
(respond.py); runner.py admits the bill in one order around the request's work."""
