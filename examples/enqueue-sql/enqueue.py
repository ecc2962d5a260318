"""The same transaction as enqueue.sql, from Python (psycopg 3):

    pip install 'psycopg[binary]'
    DATABASE_URL=postgres://bridge:bridge@127.0.0.1:5432/bridge?sslmode=disable \
      python3 examples/enqueue-sql/enqueue.py asset-42
"""

import json
import os
import sys

import psycopg

asset = sys.argv[1] if len(sys.argv) > 1 else "asset-42"
with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
    conn.execute("CREATE TABLE IF NOT EXISTS example_assets (id text PRIMARY KEY, version int NOT NULL)")
    with conn.transaction():
        (version,) = conn.execute(
            "INSERT INTO example_assets (id, version) VALUES (%s, 1)"
            " ON CONFLICT (id) DO UPDATE SET version = example_assets.version + 1 RETURNING version",
            (asset,),
        ).fetchone()
        (event_id,) = conn.execute(
            "SELECT bridge.enqueue('assets', %s, 'asset.version_published', %s::jsonb)",
            (asset, json.dumps({"version": version})),
        ).fetchone()
    print("enqueued", event_id)
