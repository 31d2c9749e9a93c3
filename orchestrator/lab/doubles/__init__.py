"""Protocol doubles: local HTTP servers that speak a real service's protocol, for tests, demos and benchmarks.

They are models of the services, not replacements: production code talks to them exactly as to the real
thing (only the base URL differs).
"""
