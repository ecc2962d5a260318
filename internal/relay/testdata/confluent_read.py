"""Reads a topic with Confluent's own Python client and its registry-aware
deserializer (confluent-kafka: SchemaRegistryClient + JSONDeserializer, or
AvroDeserializer with FORMAT avro), and prints one JSON line per record: the
dedup-id header and the deserialized value. Avro values are printed the way
the bridge maps them to JSON: bytes and fixed as base64, decimals as strings,
timestamps as RFC 3339 in UTC (milliseconds), dates as YYYY-MM-DD, UUIDs as
strings. Used by the relay's schema tests as a reader no one here wrote.

usage: confluent_read.py BOOTSTRAP TOPIC REGISTRY_URL COUNT TIMEOUT_SECONDS [json|avro]
"""
import base64
import datetime
import decimal
import json
import sys
import time
import uuid

from confluent_kafka import Consumer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext


def as_json(v):
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(v).decode()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, datetime.datetime):
        return v.astimezone(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    if isinstance(v, datetime.date):
        return v.isoformat()
    if isinstance(v, uuid.UUID):
        return str(v)
    raise TypeError("cannot print %r" % (v,))


def main():
    bootstrap, topic, registry, count, timeout = sys.argv[1:6]
    count, deadline = int(count), time.time() + float(timeout)
    # schema_str None: the deserializer fetches the writer's schema by the
    # id in each record's framing and validates the value against it.
    fmt = sys.argv[6] if len(sys.argv) > 6 else "json"
    client = SchemaRegistryClient({"url": registry})
    if fmt == "avro":
        deser = AvroDeserializer(client)
    else:
        deser = JSONDeserializer(None, schema_registry_client=client)
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
            print(json.dumps({"dedup_id": headers.get("dedup-id"), "value": value}, default=as_json), flush=True)
            seen += 1
    finally:
        consumer.close()
    if seen < count:
        raise SystemExit("read %d of %d records before the deadline" % (seen, count))


if __name__ == "__main__":
    main()
