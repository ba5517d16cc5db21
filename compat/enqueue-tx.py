"""The Python example of docs/postgresql.md ("Enqueue in your transaction"),
run by TestPGEnqueueFromPython: psycopg 3, a job pushed in the transaction
that writes the row it is about; and one rolled back. QUEUED_PG_URL and
QUEUED_NS name the database and the namespace; it prints the committed
job's id."""
import os

import psycopg
from psycopg.types.json import Jsonb

ns = os.environ["QUEUED_NS"]
conn = psycopg.connect(os.environ["QUEUED_PG_URL"])
conn.execute(f"CREATE TABLE IF NOT EXISTS queued_{ns}.orders (id int, total numeric)")
conn.commit()


# The example.
def place_order(order_id, total, fail):
    with conn.transaction():
        conn.execute(f"INSERT INTO queued_{ns}.orders (id, total) VALUES (%s, %s)", (order_id, total))
        (job_id,) = conn.execute(
            f"SELECT queued_{ns}.push(%s, %s, %s, %s)",
            ("emails", "receipt", Jsonb({"order": order_id}), Jsonb({"maxAttempts": 5})),
        ).fetchone()
        if fail:
            raise RuntimeError("the order failed")
    return job_id


try:
    place_order(41, 10, True)
except RuntimeError:
    pass
print(place_order(42, 99.5, False))
conn.close()
