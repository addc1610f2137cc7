"""Multi-site replication through routing queues (``docs/replication.md``).

A site is one tidelog deployment. An application hands the source site an opaque payload and the
sites it goes to; the payload is stored once in a shared send queue, tagged per destination, and
one sender session per remote site ships that site's entries, in order, exactly once, with a
snapshot sync when deltas alone cannot catch the site up.

Built so far, as sans-IO cores tested alone: the sender session's state table
(``sync_states.py``), negotiation (``negotiation.py``), the two ends of a transfer — the sink's
apply window and the sender's resend window (``windows.py``) — the send queue's record format
(``envelope.py``), the tag index (``tag_index.py``) and positions with the lifts a source
learns after losing its data (``positions.py``); on the broker, the site registry
(``registry.py``), the delta queue with its checks (``send_queue.py``), the sender per remote
site (``sender.py``, over ``tidelog.v1/Replicate``), the sink's exactly-once apply into receive
queues (``sink.py``), the queue's release by acknowledgement and the tag index's snapshot
(``upkeep.py``, ``tag_index_file.py``), status (``status.py``), and this site's face for the api
(``local_site.py``). Still to come: snapshot sync (issue 13).
"""
