//! A delivery of bill files imported as one change: its files stored, the files in force they
//! replace by the period-replacement rule, a file that repeats another of its periods refused,
//! and the hours whose attribution moves marked to roll up; all in one transaction, or nothing.

use std::collections::HashSet;

use crate::store::bills::BillFiles;
use crate::store::bills::{DeliveredFile, Period};
use crate::store::db::Tx;
use crate::store::{self, ImportOutcome, Replaces, Store, StoreError};

/// Imports `files`, one delivery, replacing what `replaces` names in the periods they cover.
pub async fn delivery(
    store: &dyn Store,
    replaces: Replaces,
    files: &mut BillFiles,
) -> Result<Vec<ImportOutcome>, StoreError> {
    let mut tx = store.db().begin().await?;
    let mut stored = store::bills::store_files(&mut tx, files).await?;
    let ours: HashSet<i64> = stored.files.iter().map(|f| f.import_id).collect();
    for (victim, period, by) in replaced(&mut tx, &stored.files, &ours, replaces).await? {
        let (deleted, span) =
            store::bills::replace_file_period(&mut tx, (victim, &period), by, stored.imported_ms)
                .await?;
        stored.spans.extend(span);
        for o in stored.outcomes.iter_mut() {
            if let ImportOutcome::Imported {
                import_id,
                replaced_lines,
                ..
            } = o
            {
                if *import_id == by {
                    *replaced_lines += deleted;
                }
            }
        }
    }
    if replaces == Replaces::SameName {
        refuse_repeats(&mut tx, (&stored.files, &stored.outcomes), &ours).await?;
    }
    let spans: Vec<(i64, i64)> = stored.spans.into_iter().collect();
    store::bills::mark_hours_of_spans(&mut tx, &spans).await?;
    tx.commit().await?;
    Ok(stored.outcomes)
}

/// The period-replacement rule: what each file of the delivery replaces, period by period. A
/// file in force for one of its periods that is not of the delivery goes where the delivery is
/// the whole of its periods (`WholePeriods`), or where it has the same name and source (the same
/// part delivered again, `SameName`). Each (file, period) once, with the file replacing it.
async fn replaced(
    tx: &mut Tx,
    delivered: &[DeliveredFile],
    ours: &HashSet<i64>,
    replaces: Replaces,
) -> Result<Vec<(i64, Period, i64)>, StoreError> {
    let mut victims = Vec::new();
    let mut seen: HashSet<(i64, Period)> = HashSet::new();
    for file in delivered {
        for period in &file.periods {
            for (victim, name, source) in store::bills::files_in_force(&mut *tx, period).await? {
                let replaced = !ours.contains(&victim)
                    && match replaces {
                        Replaces::WholePeriods => true,
                        Replaces::SameName => name == file.name && source == file.source,
                    };
                if replaced && seen.insert((victim, period.clone())) {
                    victims.push((victim, period.clone(), file.import_id));
                }
            }
        }
    }
    Ok(victims)
}

/// A file of another name adds to its periods; one that repeats most of what another file in
/// force says is a new export of the same period imported as a part, which would count the
/// period twice: refused, saying how to import it.
async fn refuse_repeats(
    tx: &mut Tx,
    (delivered, outcomes): (&[DeliveredFile], &[ImportOutcome]),
    ours: &HashSet<i64>,
) -> Result<(), StoreError> {
    for file in delivered {
        let Some(ImportOutcome::Imported { rows, .. }) = outcomes.iter().find(|o| {
            matches!(o, ImportOutcome::Imported { import_id, .. } if *import_id == file.import_id)
        }) else {
            continue;
        };
        let sampled = (*rows).min(u64::from(store::REPEAT_SAMPLE_LINES));
        // Only files in force for the same periods can be repeated: usually none.
        let mut others: Vec<(i64, String)> = Vec::new();
        for period in &file.periods {
            let found = store::bills::files_in_force(&mut *tx, period).await?;
            others.extend(
                (found.into_iter())
                    .filter(|(id, _, _)| !ours.contains(id))
                    .map(|(id, name, _)| (id, name)),
            );
        }
        others.sort();
        others.dedup();
        for (other_id, other) in others {
            let repeated = store::bills::repeated_lines(
                &mut *tx,
                (file.import_id, other_id),
                store::REPEAT_SAMPLE_LINES,
            )
            .await?;
            if repeated > 0 && (repeated as u64) * 2 >= sampled {
                return Err(StoreError::Rejected {
                    file: file.name.clone(),
                    error: gpuledger_core::bill::FocusError::RepeatsFile {
                        other,
                        repeated: repeated as u64,
                        sampled,
                    },
                });
            }
        }
    }
    Ok(())
}
