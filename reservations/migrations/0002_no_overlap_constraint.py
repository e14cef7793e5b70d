"""The no-overlap guarantee on PostgreSQL: no two occupying rows of one GPU overlap in time.

Written as SQL run only on PostgreSQL because SQLite has neither btree_gist nor exclusion
constraints; there the booking transaction is IMMEDIATE, which serializes check-then-insert.
"""

from django.db import migrations

CREATE = """
CREATE EXTENSION IF NOT EXISTS btree_gist;
ALTER TABLE reservations_reservationgpu
    ADD CONSTRAINT reservationgpu_no_overlap
    EXCLUDE USING gist (gpu_id WITH =, tstzrange(start, "end", '[)') WITH &&)
    WHERE (occupies);
"""
DROP = "ALTER TABLE reservations_reservationgpu DROP CONSTRAINT IF EXISTS reservationgpu_no_overlap;"


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("reservations", "0001_initial")]
    operations = [migrations.RunPython(create, drop)]
