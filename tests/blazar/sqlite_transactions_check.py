"""Checks blazar_server.py's SQLite transactions: two threads that each read, then write, in one
transaction through an oslo.db engine (as Blazar's API and manager do) both commit.

    .venv-blazar/bin/python sqlite_transactions_check.py DIRECTORY

Without blazar_server.serialize_sqlite_transactions, oslo.db's deferred BEGIN lets both threads read
under a shared lock, and the second to write fails at once with "database is locked" (as a lease's
start did in CI, 11-29). Prints one line; exits 0 when both committed, 1 otherwise.
"""
import os
import sys
import threading

import blazar_server
from oslo_db.sqlalchemy import engines

THREADS = 2


def main():
    blazar_server.serialize_sqlite_transactions()
    engine = engines.create_engine("sqlite:///" + os.path.join(sys.argv[1], "transactions.db"))
    with engine.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE counter (id INTEGER PRIMARY KEY, value INTEGER)")
        connection.exec_driver_sql("INSERT INTO counter VALUES (1, 0)")
    both_read = threading.Barrier(THREADS)
    errors = []

    def read_then_write():
        try:
            with engine.begin() as connection:
                connection.exec_driver_sql("SELECT value FROM counter").fetchall()
                # Without the fix both hold the shared lock here; with it the second waits in BEGIN
                # and the barrier times out for the first, which goes on.
                try:
                    both_read.wait(timeout=1)
                except threading.BrokenBarrierError:
                    pass
                connection.exec_driver_sql("UPDATE counter SET value = value + 1")
        except Exception as error:  # noqa: BLE001 - reported, and the check fails
            errors.append(str(error).splitlines()[0])

    threads = [threading.Thread(target=read_then_write) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with engine.connect() as connection:
        value = connection.exec_driver_sql("SELECT value FROM counter").scalar()
    print(f"{THREADS - len(errors)} of {THREADS} read-then-write transactions committed, counter {value}"
          + "".join(f"; {error}" for error in errors))
    return 0 if not errors and value == THREADS else 1


if __name__ == "__main__":
    sys.exit(main())
