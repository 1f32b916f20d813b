"""Attempts on a Ray cluster (`gpupool[ray]`): the nodes of the pool and their reservations
(`nodes.py`), each node's launcher actor (`launcher.py`), the executor (`executor.py`), a gang
as it tracks one (`gang.py`, no Ray) and finding gangs again after a restart (`adopt.py`).

Nothing is imported here: `gang.py` is read without Ray, and Ray loads only with the modules
that use it.
"""
