"""Billing: prices from the catalog, holds before the work, one ledger entry per request after."""
