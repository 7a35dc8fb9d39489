"""The Search-R1 task: multi-turn question answering with a retriever tool (task.py), the BM25 retriever service
(index.py, server.py, service.py, client.py), the offline knowledge base (offline.py), loaders for the published
layouts (data.py), tool-call formats (format.py) and the exact-match reward (reward.py).

Nothing is imported here: the retriever server process (``python -m zeromismatch.tasks.search.server``) loads
only what it serves with."""
