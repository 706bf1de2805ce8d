"""``brisklm serve``: an OpenAI-compatible HTTP server (``pip install 'brisklm[server]'``).

``protocol`` reads OpenAI's request bodies and writes its responses (no web framework);
``app.build_app(llm, name)`` serves them on Starlette, which ``brisklm serve`` runs with uvicorn.
"""
