"""Several reads in one database round trip (issue #19: the booking path and the reports).

`fetch_together(a, b, ...)` returns each `.values()` queryset's rows as the dicts `.values()`
would give. On PostgreSQL it sends one statement: each query becomes a scalar subquery whose
rows are aggregated to a JSON array, and the values are turned back into the Python types
the ORM gives (times, durations, decimals, UUIDs; JSON stays JSON). Elsewhere (SQLite, the
embedded mode, where a query is a function call, not a round trip) each query runs as usual.
The rules stay in the querysets; this only changes how they travel.

`fetch_prepared(key=..., build=..., values=...)` is `fetch_together(*build(values))` for a
read made on every request (the booking check): the statement is built once per shape and
reused with new values, because building and compiling the querysets is most of the CPU
such a read costs. `insert(objs)` is the same saving for writes: `bulk_create` without the
ORM compiling the statement.
"""

import datetime as dt
import decimal
import json
import threading
import uuid
from collections.abc import Callable, Hashable, Sequence

from django.core.exceptions import EmptyResultSet
from django.db import connections, router
from django.db.models import Model, QuerySet
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


def instance_from_row(model, row: dict, prefix: str = ""):
    """A model instance from a `.values()` row that holds its concrete fields by attname
    (`prefix`: as `<relation>__` when read across a relation); see `columns`."""
    fields = model._meta.concrete_fields
    return model.from_db(None, [field.attname for field in fields], [row[prefix + field.attname] for field in fields])


def columns(model, prefix: str = "") -> list[str]:
    """The `.values()` names `instance_from_row` needs."""
    return [prefix + field.attname for field in model._meta.concrete_fields]


def instance_from_json(model, data: dict):
    """A model instance from its row as PostgreSQL's `row_to_json` gives it."""
    fields = model._meta.concrete_fields
    return model.from_db(
        None, [field.attname for field in fields], [_from_json(field, data[field.column]) for field in fields]
    )


def _together(querysets: Sequence[QuerySet], *, fewest: int = 2) -> str | None:
    """The alias to send `querysets` to as one statement, or None to run them one by one."""
    for queryset in querysets:
        if queryset._iterable_class is not ValuesIterable:
            raise TypeError("fetch_together takes .values() querysets")
    aliases = {queryset.db for queryset in querysets}
    if len(aliases) != 1 or len(querysets) < fewest:
        return None
    alias = aliases.pop()
    return alias if connections[alias].vendor == "postgresql" else None


def _statement(querysets: Sequence[QuerySet]) -> tuple[str, list, list]:
    """(SQL, parameters, each queryset's (names, fields) or None when it can match nothing)."""
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
    return (f"SELECT {', '.join(parts)}" if parts else ""), params, shapes


def _send(alias: str, sql: str, params: Sequence, shapes: list) -> list[list[dict]]:
    row = iter(())
    if sql:
        with connections[alias].cursor() as cursor:
            cursor.execute(sql, params)
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


def fetch_together(*querysets: QuerySet) -> list[list[dict]]:
    alias = _together(querysets)
    if alias is None:
        return [list(queryset) for queryset in querysets]
    return _send(alias, *_statement(querysets))


# --- prepared: built once per shape -------------------------------------------------------

Value = int | str | dt.datetime | list[int] | None
# A statement kept per shape. The shapes of one read are few (see `fetch_prepared`); the
# bound only keeps a caller with an unexpectedly wide key from growing the process.
_PREPARED_LIMIT = 256
_prepared: dict[Hashable, tuple | None] = {}
_prepared_lock = threading.Lock()  # gunicorn's threads share it
# The stand-ins: datetimes all move by the same amount (their order, ties included, stays);
# each int value moves by its own offset, far above any id, and each string gains its own
# suffix, so no two values' stand-ins meet.
_MOVES = ((-dt.timedelta(days=1, microseconds=1), 1 << 40), (-dt.timedelta(days=2, microseconds=3), 1 << 42))


def _stand_ins(values: dict[str, Value], move: tuple[dt.timedelta, int]) -> dict[str, Value]:
    shift, offset = move
    stand_ins = {}
    for number, (name, value) in enumerate(sorted(values.items())):
        if isinstance(value, dt.datetime):
            stand_ins[name] = value + shift
        elif isinstance(value, list):
            stand_ins[name] = [item + offset * (number + 1) for item in value]
        elif isinstance(value, int) and not isinstance(value, bool):
            stand_ins[name] = value + offset * (number + 1)
        elif isinstance(value, str):
            stand_ins[name] = f"{value} (stand-in {offset * (number + 1)})"
        elif value is None:
            stand_ins[name] = None
        else:
            raise TypeError(f"fetch_prepared takes ints, int lists, strings, datetimes and None, not {name}={value!r}")
    return stand_ins


def _slots(values: dict[str, Value]) -> dict:
    """{value: (name, index or None)}: where each value came from."""
    slots = {}
    for name, value in values.items():
        if isinstance(value, list):
            slots.update({item: (name, index) for index, item in enumerate(value)})
        elif value is not None:
            slots[value] = (name, None)
    return slots


def _prepare(build, values: dict[str, Value]):
    """Build with the values and twice with stand-ins: each parameter that follows a value is
    that value's slot, one that stays put is a constant. None when the three do not line up
    (a value changed on its way into the SQL): such a read is not kept."""
    querysets = build(values)
    alias = _together(querysets, fewest=1)  # one read too: kept, it is not compiled again
    if alias is None:
        return None
    sql, params, shapes = _statement(querysets)
    try:
        moved = [_stand_ins(values, move) for move in _MOVES]
    except OverflowError:  # a datetime at the edge of the calendar: run it as it is
        return None
    built = [_statement(build(stand_ins)) for stand_ins in moved]
    if any(other_sql != sql or len(other_params) != len(params) for other_sql, other_params, _ in built):
        return None
    lookups = [_slots(stand_ins) for stand_ins in moved]
    recipe = []
    for position, value in enumerate(params):
        seen = [other_params[position] for _, other_params, _ in built]
        if all(type(other) is type(value) and other == value for other in seen):
            recipe.append((None, value))
            continue
        try:
            found = {lookup.get(other) for lookup, other in zip(lookups, seen, strict=True)}
        except TypeError:  # an unhashable parameter that moved
            return None
        if len(found) != 1 or None in found:
            return None
        (slot,) = found
        if _value(values, slot) != value:
            return None
        recipe.append((slot, None))
    return alias, sql, tuple(recipe), shapes


def _value(values: dict[str, Value], slot: tuple[str, int | None]):
    name, index = slot
    return values[name] if index is None else values[name][index]


def fetch_prepared(
    *, key: Hashable, build: Callable[[dict[str, Value]], Sequence[QuerySet]], values: dict[str, Value]
) -> list[list[dict]]:
    """`fetch_together(*build(values))`, its statement built once per shape and reused.

    `key` must name whatever changes the statement's shape other than the order of the
    datetimes (added here): which querysets `build` makes, and how — which values are None,
    each list's length. `build` must take every value from its argument (one it took from
    elsewhere would be kept as a constant) and use them as they are: compare datetimes,
    pass them on; no arithmetic, no comparing two ints or strings. Each list must hold
    distinct ints. The first call of a shape checks the rest (`_prepare`); a read that fails
    the check is sent as fetch_together sends it, every time."""
    for name, value in values.items():
        if isinstance(value, list) and len(set(value)) != len(value):
            raise ValueError(f"fetch_prepared: {name} repeats a value")
    moments = {name: value for name, value in values.items() if isinstance(value, dt.datetime)}
    times = sorted(set(moments.values()))
    order = tuple(sorted((name, times.index(value)) for name, value in moments.items()))
    full_key = (key, order)
    if full_key not in _prepared:
        prepared = _prepare(build, values)  # None: not kept (or not PostgreSQL), sent as it is
        with _prepared_lock:
            if len(_prepared) >= _PREPARED_LIMIT:
                _prepared.pop(next(iter(_prepared)))  # the oldest
            _prepared[full_key] = prepared
    prepared = _prepared.get(full_key)
    if prepared is None:
        return fetch_together(*build(values))
    alias, sql, recipe, shapes = prepared
    return _send(alias, sql, [constant if slot is None else _value(values, slot) for slot, constant in recipe], shapes)


# --- writes -------------------------------------------------------------------------------


def insert(objs: Sequence[Model]) -> None:
    """Write `objs` (new instances of one model) in one INSERT and give each its primary key,
    as `bulk_create` does: each field's own `pre_save` and database conversion, the model's
    defaults set when the instance was made. Without the ORM building and compiling the
    statement, which is most of what a write costs this process (issue #19: five writes on
    every booking). No signals are sent (gpubook has none); an IntegrityError is raised as
    the ORM raises it."""
    if not objs:
        return
    model = type(objs[0])
    meta = model._meta
    connection = connections[router.db_for_write(model)]
    if not connection.features.can_return_rows_from_bulk_insert:
        model.objects.bulk_create(objs)
        return
    numbered = meta.pk.db_returning  # an AutoField: the database numbers the rows
    fields = [field for field in meta.concrete_fields if not (numbered and field.primary_key)]
    params = [
        field.get_db_prep_save(field.pre_save(obj, True), connection=connection) for obj in objs for field in fields
    ]
    quote = connection.ops.quote_name
    row = f"({', '.join(['%s'] * len(fields))})"
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(field.column) for field in fields)})"  # noqa: S608
        f" VALUES {', '.join([row] * len(objs))}"
        + (f" RETURNING {quote(meta.pk.column)}" if numbered else "")
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        if numbered:  # in the order of VALUES, as bulk_create relies on too
            for obj, (key,) in zip(objs, cursor.fetchall(), strict=True):
                setattr(obj, meta.pk.attname, key)
    for obj in objs:
        obj._state.adding = False
        obj._state.db = connection.alias
