"""The OpenAI API over the relay: request shapes (protocol.py), each route declared once (routes.py),
and the HTTP front end (frontend.py)."""
