"""Reads a topic with Confluent's own Python client and its registry-aware
deserializer (confluent-kafka: SchemaRegistryClient + JSONDeserializer), and
prints one JSON line per record: the dedup-id header and the deserialized
value. Used by the relay's schema tests as a reader no one here wrote.

usage: confluent_read.py BOOTSTRAP TOPIC REGISTRY_URL COUNT TIMEOUT_SECONDS
"""
import json
import sys
import time

from confluent_kafka import Consumer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.json_schema import JSONDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext


def main():
    bootstrap, topic, registry, count, timeout = sys.argv[1:6]
    count, deadline = int(count), time.time() + float(timeout)
    # schema_str None: the deserializer fetches the writer's schema by the
    # id in each record's framing and validates the value against it.
    deser = JSONDeserializer(None, schema_registry_client=SchemaRegistryClient({"url": registry}))
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": "confluent-read-" + topic,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    consumer.subscribe([topic])
    seen = 0
    try:
        while seen < count and time.time() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                raise SystemExit("consume: %s" % msg.error())
            value = deser(msg.value(), SerializationContext(topic, MessageField.VALUE))
            headers = dict((k, v.decode()) for k, v in (msg.headers() or []))
            print(json.dumps({"dedup_id": headers.get("dedup-id"), "value": value}), flush=True)
            seen += 1
    finally:
        consumer.close()
    if seen < count:
        raise SystemExit("read %d of %d records before the deadline" % (seen, count))


if __name__ == "__main__":
    main()
