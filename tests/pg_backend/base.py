"""PostgreSQL for the specs: Django's backend, with a test's flush done by DELETE.

A transactional spec ends with every table emptied. Django empties them with one TRUNCATE of
all ~80 tables, which on PostgreSQL swaps each table's files on disk: ~0.8 s a spec on a busy
2-CPU machine, most of the clustered suite's time. The tables hold a few rows each by then, so
DELETE (every foreign key is DEFERRABLE INITIALLY DEFERRED, checked when the flush's
transaction commits, by which time every table is empty) does the same in milliseconds.
Production never flushes; this module is only named by tests/settings.py."""

from django.db.backends.postgresql import base


class DatabaseOperations(base.DatabaseOperations):
    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if reset_sequences or allow_cascade or not tables:
            return super().sql_flush(style, tables, reset_sequences=reset_sequences,
                                     allow_cascade=allow_cascade)
        return [f"{style.SQL_KEYWORD('DELETE FROM')} {style.SQL_FIELD(self.quote_name(t))};"
                for t in tables]


class DatabaseWrapper(base.DatabaseWrapper):
    ops_class = DatabaseOperations
