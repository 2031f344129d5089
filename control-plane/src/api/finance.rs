//! `/v1/finance`: the cost ledger's summary and exports, and team budgets.
//!
//! Finance and admin tokens read everything; a team token reads its own team's lines only
//! (never the idle lines, which belong to no team).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Datelike, Duration, TimeZone, Utc};
use serde::{Deserialize, Serialize};
use spotplane_core::{FieldErrors, Micros};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::extract::{ApiQuery, Auth, JsonBody};
use super::problem::{ApiError, Problem};
use crate::finance::LedgerEntry;
use crate::finance::export::{FocusAccount, to_csv, to_focus_csv};
use crate::finance::summary::{GroupBy, Summary, summarize};
use crate::model::Role;
use crate::store::Principal;

/// The longest range one request may cover.
const MAX_RANGE_DAYS: i64 = 400;

/// A time range: `[from, to)`, RFC 3339.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SummaryQuery {
    /// Start (inclusive), RFC 3339; default: the first of this month (UTC). At most 400 days
    /// before `to`.
    #[param(value_type = Option<String>, format = DateTime)]
    pub from: Option<String>,
    /// End (exclusive), RFC 3339, later than `from`; default: now.
    #[param(value_type = Option<String>, format = DateTime)]
    pub to: Option<String>,
    /// `team`, `job`, `provider`, `region` or `market` (default `team`).
    #[param(value_type = Option<GroupBy>)]
    pub group_by: Option<String>,
}

/// A time range and a format.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ExportQuery {
    /// Start (inclusive), RFC 3339; default: the first of this month (UTC). At most 400 days
    /// before `to`.
    #[param(value_type = Option<String>, format = DateTime)]
    pub from: Option<String>,
    /// End (exclusive), RFC 3339, later than `from`; default: now.
    #[param(value_type = Option<String>, format = DateTime)]
    pub to: Option<String>,
    /// `csv` (the ledger's lines) or `focus` (FinOps FOCUS columns); default `csv`.
    #[param(pattern = "^(csv|focus)$")]
    pub format: Option<String>,
}

fn parse_time(v: Option<&str>, field: &str, errs: &mut FieldErrors) -> Option<DateTime<Utc>> {
    let s = v?;
    match DateTime::parse_from_rfc3339(s) {
        Ok(t) => Some(t.with_timezone(&Utc)),
        Err(e) => {
            errs.push(field, format!("{s:?} is not an RFC 3339 time: {e}"));
            None
        }
    }
}

/// Reads and checks a range, reporting every problem.
fn range(
    from: Option<&str>,
    to: Option<&str>,
    now: DateTime<Utc>,
    errs: &mut FieldErrors,
) -> (DateTime<Utc>, DateTime<Utc>) {
    let month = Utc
        .with_ymd_and_hms(now.year(), now.month(), 1, 0, 0, 0)
        .single()
        .unwrap_or(now);
    let f = parse_time(from, "from", errs).unwrap_or(month);
    let t = parse_time(to, "to", errs).unwrap_or(now);
    if t <= f {
        errs.push("to", "must be later than from");
    } else if t - f > Duration::days(MAX_RANGE_DAYS) {
        errs.push(
            "to",
            format!("the range may cover at most {MAX_RANGE_DAYS} days"),
        );
    }
    (f, t)
}

/// The team whose lines the caller may see: `None` for finance and admin (everything).
fn team_scope(p: &Principal) -> Option<&str> {
    match p.role {
        Role::Team => p.team.as_ref().map(|(id, _)| id.as_str()),
        _ => None,
    }
}

async fn entries(
    state: &AppState,
    p: &Principal,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<LedgerEntry>, ApiError> {
    Ok(state
        .store()
        .ledger_entries(from, to, team_scope(p))
        .await?)
}

#[utoipa::path(get, path = "/v1/finance/summary", tag = "finance", params(SummaryQuery),
    responses((status = 200, body = Summary), (status = 400, body = Problem), (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn summary(
    State(state): State<AppState>,
    auth: Auth,
    ApiQuery(q): ApiQuery<SummaryQuery>,
) -> Result<Json<Summary>, ApiError> {
    let p = auth.require(&[Role::Admin, Role::Finance, Role::Team])?;
    let mut errs = FieldErrors::new();
    let (from, to) = range(q.from.as_deref(), q.to.as_deref(), state.now(), &mut errs);
    let by = match q.group_by.as_deref().map(str::parse::<GroupBy>) {
        None => GroupBy::Team,
        Some(Ok(g)) => g,
        Some(Err(m)) => {
            errs.push("group_by", m);
            GroupBy::Team
        }
    };
    errs.into_result()?;
    let lines = entries(&state, p, from, to).await?;
    Ok(Json(summarize(&lines, from, to, by)))
}

#[utoipa::path(get, path = "/v1/finance/export.csv", tag = "finance", params(ExportQuery),
    responses((status = 200, content_type = "text/csv", body = String,
        description = "The ledger's charge lines; with format=focus, in FinOps FOCUS columns"),
        (status = 400, body = Problem), (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn export_csv(
    State(state): State<AppState>,
    auth: Auth,
    ApiQuery(q): ApiQuery<ExportQuery>,
) -> Result<Response, ApiError> {
    let p = auth.require(&[Role::Admin, Role::Finance, Role::Team])?;
    let mut errs = FieldErrors::new();
    let (from, to) = range(q.from.as_deref(), q.to.as_deref(), state.now(), &mut errs);
    let focus = match q.format.as_deref() {
        None | Some("csv") => false,
        Some("focus") => true,
        Some(other) => {
            errs.push("format", format!("{other:?} is not csv or focus"));
            false
        }
    };
    errs.into_result()?;
    let lines = entries(&state, p, from, to).await?;
    let (body, name) = if focus {
        let account = state.focus_account();
        (to_focus_csv(&lines, &account), "focus")
    } else {
        (to_csv(&lines), "ledger")
    };
    let file = format!(
        "attachment; filename=\"spotplane-{name}-{}-{}.csv\"",
        from.format("%Y%m%dT%H%M%SZ"),
        to.format("%Y%m%dT%H%M%SZ")
    );
    let mut resp = body.into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/csv; charset=utf-8"),
    );
    if let Ok(v) = HeaderValue::from_str(&file) {
        resp.headers_mut().insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(resp)
}

/// A team's monthly budget; `budget.alert` webhooks fire at 50, 80 and 100 % of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// US dollars per calendar month (UTC); `null` removes the budget.
    pub monthly_usd: Option<f64>,
}

#[utoipa::path(get, path = "/v1/teams/{team}/budget", tag = "finance",
    params(("team" = String, Path, description = "Team name")),
    responses((status = 200, body = Budget), (status = 404, body = Problem)), security(("bearer" = [])))]
pub async fn get_budget(
    State(state): State<AppState>,
    auth: Auth,
    Path(team): Path<String>,
) -> Result<Json<Budget>, ApiError> {
    let p = auth.require(&[Role::Admin, Role::Finance, Role::Team])?;
    if p.role == Role::Team && p.team.as_ref().is_none_or(|(_, n)| n.as_str() != team) {
        return Err(ApiError::NotFound(format!("no team {team}")));
    }
    let t = state.store().get_team(&team).await?;
    let monthly = state
        .store()
        .team_budgets()
        .await?
        .into_iter()
        .find(|b| b.team_id == t.id)
        .map(|b| b.monthly.as_usd_f64());
    Ok(Json(Budget {
        monthly_usd: monthly,
    }))
}

#[utoipa::path(put, path = "/v1/teams/{team}/budget", tag = "finance", request_body = Budget,
    params(("team" = String, Path, description = "Team name")),
    responses((status = 200, body = Budget), (status = 404, body = Problem), (status = 422, body = Problem)),
    security(("bearer" = [])))]
pub async fn put_budget(
    State(state): State<AppState>,
    auth: Auth,
    Path(team): Path<String>,
    body: JsonBody,
) -> Result<Json<Budget>, ApiError> {
    auth.require(&[Role::Admin])?;
    let b: Budget = body.parse()?;
    let monthly = match b.monthly_usd {
        None => None,
        Some(v) if v > 0.0 && v <= 1e9 => Some(
            Micros::from_usd_f64(v).map_err(|e| ApiError::field("monthly_usd", e.to_string()))?,
        ),
        Some(_) => {
            return Err(ApiError::field(
                "monthly_usd",
                "must be above 0 and at most 1000000000",
            ));
        }
    };
    let t = state.store().get_team(&team).await?;
    state
        .store()
        .set_team_budget(&t.id, monthly, state.now())
        .await?;
    // What was stored, which is what alerts are measured against.
    Ok(Json(Budget {
        monthly_usd: monthly.map(|m| m.as_usd_f64()),
    }))
}

impl AppState {
    fn focus_account(&self) -> FocusAccount {
        FocusAccount {
            id: self.finance().billing_account_id.clone(),
            name: self.finance().billing_account_name.clone(),
        }
    }
}
