"""Blazar's API and manager in one process, for tests: run by .venv-blazar's python (blazar 18.0.0).

    blazar_server.py --config-file blazar.conf --port-file PATH [--create-schema]

With --create-schema it first makes Blazar's tables in the configured (new) database and records them as
the migrations' head, as `blazar-db-manage stamp head` would: Blazar's alembic migrations cannot run on
SQLite ("ALTER TABLE instance_reservations ALTER COLUMN affinity DROP NOT NULL": SQLite has no ALTER
COLUMN), so the schema comes from Blazar's models, as upstream's own tests make it
(blazar.db.sqlalchemy.api.setup_db). Done here, in the interpreter that imports Blazar anyway, rather
than in two more before it (1.4 and 1.9 s of CPU, mostly importing Blazar).

The API is upstream's WSGI application (blazar.api.app.VersionSelectorApplication, what blazar-api and
blazar-api-wsgi serve) under wsgiref's threading server on 127.0.0.1, port 0; the manager is upstream's
ManagerService, started as blazar-manager starts it but in this process. Both talk over oslo.messaging's in-process
fake:// transport, which needs them in one process (blazar.rpc keeps one transport per process). The
port goes to --port-file once the socket is bound. One change from blazar-manager: the manager looks for
due lease events every second instead of every 10 s (EVENT_INTERVAL, a module constant upstream), so a
lease that starts now is ACTIVE within about a second.

SQLite, not MySQL: the API's threads and the manager's write the same file at once, and oslo.db opens
each transaction with a deferred BEGIN, so two transactions that both read, then write, deadlock on
the lock upgrade and SQLite fails one at once with "database is locked" (seen in CI: a lease's
start_lease collided with another lease's create and the lease went to ERROR). Every transaction here
takes the write lock when it begins (BEGIN IMMEDIATE) and waits up to 60 s for it, so they run one
after another, as MySQL's row locks would let them.
"""
import argparse
import gettext
import os
import signal
import socketserver
import sqlite3
import sys
import threading
from wsgiref import simple_server

gettext.install("blazar")

# blazar first: importing it selects oslo.service's threading backend, which must precede any other
# import of oslo_service (that would select eventlet).
import blazar  # noqa: E402,F401
import blazar.db.migration  # noqa: E402
from alembic import config as alembic_config  # noqa: E402
from alembic import script as alembic_script  # noqa: E402
from alembic.runtime import migration  # noqa: E402
from blazar.api import app as wsgi_app  # noqa: E402
from blazar.db.sqlalchemy import api as db_api  # noqa: E402
from blazar.manager import service as manager_service  # noqa: E402
from blazar.notification import notifier  # noqa: E402
from blazar.utils import service as service_utils  # noqa: E402
from oslo_config import cfg  # noqa: E402
import sqlalchemy  # noqa: E402

EVENT_INTERVAL_S = 1
SQLITE_LOCK_WAIT_MS = 60_000
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


class ThreadingWSGIServer(socketserver.ThreadingMixIn, simple_server.WSGIServer):
    daemon_threads = True


class QuietHandler(simple_server.WSGIRequestHandler):
    def log_message(self, *args):
        pass  # Blazar's own request log (oslo.log) records each request


def serialize_sqlite_transactions():
    """Class-level listeners, so they cover the engines oslo.db makes later, and run before oslo.db's
    own "begin" listener, which then sees the transaction begun and emits no BEGIN of its own."""

    @sqlalchemy.event.listens_for(sqlalchemy.pool.Pool, "connect")
    def wait_for_the_lock(dbapi_connection, connection_record):
        if isinstance(dbapi_connection, sqlite3.Connection):
            dbapi_connection.execute(f"PRAGMA busy_timeout = {SQLITE_LOCK_WAIT_MS}")

    @sqlalchemy.event.listens_for(sqlalchemy.engine.Engine, "begin")
    def begin_immediate(connection):
        if connection.dialect.name == "sqlite" and "in_transaction" not in connection.info:
            connection.exec_driver_sql("BEGIN IMMEDIATE")
            connection.info["in_transaction"] = True


def create_schema():
    """Blazar's tables from its models, stamped with the head revision. Not through alembic's command
    API: that runs Blazar's env.py, whose logging.config.fileConfig would silence oslo.log's loggers."""
    db_api.setup_db()
    config = alembic_config.Config(os.path.join(os.path.dirname(blazar.db.migration.__file__), "alembic.ini"))
    engine = sqlalchemy.create_engine(cfg.CONF.database.connection)
    try:
        with engine.begin() as connection:
            migration.MigrationContext.configure(connection).stamp(
                alembic_script.ScriptDirectory.from_config(config), "head")
    finally:
        engine.dispose()


def main():
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # for sigwait; threads started later inherit it
    parser = argparse.ArgumentParser()
    parser.add_argument("--config-file", required=True)
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--create-schema", action="store_true")
    args = parser.parse_args()
    cfg.CONF(["--config-file", args.config_file], project="blazar", prog="blazar-server")
    service_utils.prepare_service(sys.argv)
    serialize_sqlite_transactions()
    if args.create_schema:
        create_schema()
    notifier.init()
    manager_service.EVENT_INTERVAL = EVENT_INTERVAL_S
    manager = manager_service.ManagerService()
    httpd = simple_server.make_server("127.0.0.1", 0, wsgi_app.VersionSelectorApplication(),
                                      server_class=ThreadingWSGIServer, handler_class=QuietHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    # Started here rather than by oslo.service's launcher: with the threading backend that runs each
    # service in a forked worker (cotyledon), where the API's fake:// messages would never reach it.
    manager.start()
    temporary = args.port_file + ".tmp"
    with open(temporary, "w") as f:
        f.write(str(httpd.server_address[1]))
    os.rename(temporary, args.port_file)
    signal.sigwait(STOP_SIGNALS)
    httpd.shutdown()
    manager.stop()


if __name__ == "__main__":
    main()
