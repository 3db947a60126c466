"""Who is calling (F1): bearer tokens and their cache, authentication, and the Caller every decision names.

Imports only the store and the shared top modules.
"""
