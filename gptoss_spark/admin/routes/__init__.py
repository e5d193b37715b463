"""The admin API's routes, one router per concern; admin/app.py includes them all.

Reads answer from one status snapshot (Supervisor.status(), service/status.py) per request;
mutations take a `Mutation` (admin/dependencies.py), call the supervisor's request_* methods and
follow the Operation they return.
"""
