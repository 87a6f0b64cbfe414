"""Writes a FOCUS CSV as Parquet the way export pipelines do (pyarrow, Snappy, inferred types:
costs as doubles, dates as UTC timestamps, Tags as a map), and prints the exact totals of the
Parquet's own BilledCost and EffectiveCost values as JSON."""
import json
import sys
from decimal import Decimal

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

src, dst = sys.argv[1], sys.argv[2]
table = pacsv.read_csv(src)
# Tags as a Parquet MAP<string,string>, as AWS Data Exports write them.
tags = [json.loads(t) if t else {} for t in table.column("Tags").to_pylist()]
map_type = pa.map_(pa.string(), pa.string())
tags_array = pa.array([[(k, str(v)) for k, v in t.items()] for t in tags], type=map_type)
table = table.set_column(table.schema.get_field_index("Tags"), "Tags", tags_array)
pq.write_table(table, dst, compression="snappy")

back = pq.read_table(dst)
def total(col):
    return str(sum((Decimal(repr(float(v))) for v in back.column(col).to_pylist() if v is not None), Decimal(0)))
print(json.dumps({"billed": total("BilledCost"), "effective": total("EffectiveCost"), "rows": back.num_rows,
                  "types": {f.name: str(f.type) for f in back.schema if f.name in ("BilledCost", "ChargePeriodStart", "Tags")}}))
