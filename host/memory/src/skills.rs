//! Synthesized skills, their versions and the learning duty's reflection
//! watermark as memory tables: a skill keyed by its id within the seat, a
//! version by id and number, the watermark one per seat; each carried as
//! the store's whole row in JSON and applied by the store's rule (a skill
//! per field group, `crewlet_store::Store::apply_skills`; a version
//! newest-`updated_ms`-wins; a watermark only forward), so what a seat
//! learned, and how far its reflection read, follow it to the next node.

use crewlet_store::{ReflectionMark, SkillRow, SkillVersionRow};

store_table! {
    /// The `synthesized_skills` table of a node's store.
    Skills: SkillRow, "skills", |row| row.skill_id.clone(), apply_skills
}

store_table! {
    /// The `synthesized_skill_versions` table of a node's store.
    SkillVersions: SkillVersionRow, "skill_versions",
        |row| format!("{}#{}", row.skill_id, row.version), apply_skill_versions
}

store_table! {
    /// The `learning_marks` table: a seat's reflection watermark.
    ReflectionMarks: ReflectionMark, "learning_marks", |_row| String::new(), put_reflection_marks
}
