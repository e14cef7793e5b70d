"""Several reads in one database round trip (issue #19: the booking path and the reports).

`fetch_together(a, b, ...)` returns each `.values()` queryset's rows as the dicts `.values()`
would give. On PostgreSQL it sends one statement: each query becomes a scalar subquery whose
rows are aggregated to a JSON array, and the values are turned back into the Python types
the ORM gives (times, durations, decimals, UUIDs; JSON stays JSON). Elsewhere (SQLite, the
embedded mode, where a query is a function call, not a round trip) each query runs as usual.
The rules stay in the querysets; this only changes how they travel.
"""

import decimal
import json
import uuid

from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import QuerySet
from django.db.models.query import ValuesIterable
from django.utils.dateparse import parse_date, parse_datetime, parse_duration

# JSON text → the type the ORM hands back for that field type.
_FROM_JSON = {
    "DateTimeField": parse_datetime,
    "DateField": parse_date,
    "DurationField": parse_duration,
    "DecimalField": lambda value: decimal.Decimal(str(value)),
    "UUIDField": uuid.UUID,
}


def _from_json(field, value):
    convert = _FROM_JSON.get(field.get_internal_type())
    return convert(value) if convert is not None and value is not None else value


def instance_from_json(model, data: dict):
    """A model instance from its row as PostgreSQL's `row_to_json` gives it."""
    fields = model._meta.concrete_fields
    return model.from_db(
        None, [field.attname for field in fields], [_from_json(field, data[field.column]) for field in fields]
    )


def fetch_together(*querysets: QuerySet) -> list[list[dict]]:
    for queryset in querysets:
        if queryset._iterable_class is not ValuesIterable:
            raise TypeError("fetch_together takes .values() querysets")
    aliases = {queryset.db for queryset in querysets}
    if len(aliases) != 1 or connections[aliases.pop()].vendor != "postgresql" or len(querysets) < 2:
        return [list(queryset) for queryset in querysets]
    connection = connections[querysets[0].db]
    parts, params, shapes = [], [], []
    for queryset in querysets:
        query = queryset.query
        compiler = query.get_compiler(using=queryset.db)
        try:
            sql, query_params = compiler.as_sql()
        except EmptyResultSet:  # e.g. `pk__in=[]`: nothing to ask
            shapes.append(None)
            continue
        names = [*query.extra_select, *query.values_select, *query.annotation_select]
        # The compiler's select list is in the row's column order (the same zip ValuesIterable does).
        fields = [expression.output_field for expression, _, _ in compiler.select[: compiler.col_count]]
        columns = [f"c{number}" for number in range(len(names))]
        # Only the ORM compiler's own SQL and generated column names go into the text; every
        # value stays a parameter.
        aggregate = f"coalesce(json_agg(json_build_array({', '.join(f'q.{c}' for c in columns)})), '[]'::json)"
        parts.append(f"(SELECT {aggregate} FROM ({sql}) AS q({', '.join(columns)}))")  # noqa: S608
        params.extend(query_params)
        shapes.append((names, fields))
    row = iter(())
    if parts:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {', '.join(parts)}", params)
            row = iter(cursor.fetchone())
    results = []
    for shape in shapes:
        if shape is None:
            results.append([])
            continue
        names, fields = shape
        payload = next(row)
        rows = json.loads(payload) if isinstance(payload, str) else payload
        results.append(
            [
                {name: _from_json(field, value) for name, field, value in zip(names, fields, values, strict=True)}
                for values in rows
            ]
        )
    return results
