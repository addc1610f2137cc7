"""``InitProducerId``: producer ids for Kafka's idempotent producers, chosen without coordination.

An idempotent producer (``enable.idempotence``) asks once for a producer id and epoch, then numbers
its batches per partition; ``produce.py`` keeps its sequences per partition under ``kafka:<id>``
with the tidelog sequence ``epoch << 31 | base sequence``.

Choosing ids. An id must not be handed to two producers, across every broker of a cluster and
across restarts, and no broker asks another. Each id is 63 random bits from ``os.urandom`` (ids
are int64 >= 0): no state, no counter to persist or lose, nothing shared. Two producers get the
same id with probability about ``n * m / 2**63`` for ``n`` ids handed out while ``m`` producers'
state is kept (a partition forgets a producer once retention drops its last batch): a billion ids
against ten thousand live producers is about 1e-6. A collision is harmful only between producers
writing the same partition at the same time, and between two principals it is refused, not
merged: the id is bound to the principal that first produced with it (``tidelog.broker.producers``,
"Owners"). The alternative, a counter persisted in the data directory with the node id in the
high bits, needs the data directory behind the control seam and a node id unique forever (node ids
of named brokers are hashes here, ``session.node_id``), for odds that are already negligible.

Epochs (KIP-360). A request naming an id and its epoch (v3+) gets the same id with the next
epoch: the producer's batches under the older epoch are refused from then on
(``INVALID_PRODUCER_EPOCH``), and the id stays bound to its principal. Kafka's broker gives an
idempotent (non-transactional) producer a new id instead; both answers are valid to clients,
which take the id and epoch they are given (librdkafka and the Java client bump an idempotent
producer's epoch themselves, without asking). At the last epoch (32767) a new id is issued.
The epoch is not checked against a stored one: there is no store of ids, and only the id's owner
can produce with it whatever epoch it names.

Access. Kafka requires ``IDEMPOTENT_WRITE`` on the cluster; here any caller the connection
identified gets an id (the id grants nothing: each produce is checked for ``publish`` on its
topic, and the id is bound to the first principal that stores a batch with it).

Transactions are not served: a request with a ``transactional_id`` is answered
``TRANSACTIONAL_ID_AUTHORIZATION_FAILED``. librdkafka treats that code as fatal and reports
"Failed to acquire transactional PID from broker …: Broker: Transactional Id authorization
failed" from ``init_transactions()`` at once (the Java client throws
``TransactionalIdAuthorizationException``); ``INVALID_REQUEST`` is retried by librdkafka every
500 ms until ``init_transactions()`` times out, saying nothing more.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Final

from kio.schema.errors import ErrorCode

from tidelog.kafka.protocol import Request, answer
from tidelog.kafka.session import Session

ID_BITS: Final = 63
NO_PRODUCER: Final = -1
MAX_EPOCH: Final = 0x7FFF


def random_producer_id(entropy: Callable[[int], bytes] = os.urandom) -> int:
    """A new producer id: :data:`ID_BITS` random bits (module docstring)."""
    return int.from_bytes(entropy(8), "big") >> (64 - ID_BITS)


def granted(producer_id: int, epoch: int, fresh: Callable[[], int]) -> tuple[ErrorCode, int, int]:
    """(error, id, epoch) answering a request naming ``producer_id`` and ``epoch`` (-1 for
    neither): a new id at epoch 0, or the same id at the next epoch (module docstring)."""
    if (producer_id == NO_PRODUCER) != (epoch == NO_PRODUCER):
        return ErrorCode.invalid_request, NO_PRODUCER, NO_PRODUCER
    if producer_id == NO_PRODUCER:
        return ErrorCode.none, fresh(), 0
    if producer_id < 0 or not 0 <= epoch <= MAX_EPOCH:
        return ErrorCode.invalid_request, NO_PRODUCER, NO_PRODUCER
    if epoch == MAX_EPOCH:
        return ErrorCode.none, fresh(), 0
    return ErrorCode.none, producer_id, epoch + 1


async def init_producer_id(session: Session, request: Request) -> Any:
    body = request.body
    if body.transactional_id is not None:
        error, producer_id, epoch = (
            ErrorCode.transactional_id_authorization_failed,
            NO_PRODUCER,
            NO_PRODUCER,
        )
    else:
        error, producer_id, epoch = granted(
            getattr(body, "producer_id", NO_PRODUCER),
            getattr(body, "producer_epoch", NO_PRODUCER),
            random_producer_id,
        )
    return answer(
        request,
        throttle_time=timedelta(0),
        error_code=error,
        producer_id=producer_id,
        producer_epoch=epoch,
    )


SERVED: Final = ((22, "InitProducerId", 0, 4, init_producer_id),)
