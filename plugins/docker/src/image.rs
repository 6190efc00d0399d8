//! Making a task's image present (pull or load, bounded by `pull_timeout`) and removing
//! it when no container uses it any more.

use std::path::Path;
use std::time::Duration;

use bollard::Docker;
use bollard::auth::DockerCredentials;
use drover_plugin_sdk::DriverError;
use futures_util::StreamExt as _;

use crate::engine::{docker_err, status_of};

/// Pull `image` (a normalized reference), failing after `limit`.
pub(crate) async fn pull(
    docker: &Docker,
    image: &str,
    auth: Option<DockerCredentials>,
    limit: Duration,
) -> Result<(), DriverError> {
    let options = bollard::query_parameters::CreateImageOptions {
        from_image: Some(image.to_owned()),
        ..Default::default()
    };
    let pulling = async {
        let mut progress = docker.create_image(Some(options), None, auth);
        while let Some(step) = progress.next().await {
            step?;
        }
        Ok::<(), bollard::errors::Error>(())
    };
    match tokio::time::timeout(limit, pulling).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            let why = match &e {
                bollard::errors::Error::DockerResponseServerError { message, .. } => {
                    message.clone()
                }
                other => other.to_string(),
            };
            Err(DriverError::FailedPrecondition(format!(
                "image {image} is not present and pulling it failed: {why}"
            )))
        }
        Err(_) => Err(DriverError::Timeout(format!(
            "image {image} is not present and pulling it did not finish within the pull \
             timeout ({})",
            humantime::format_duration(limit)
        ))),
    }
}

/// Load the image tarball `file` (found at `path`, for messages; opened beneath the task
/// directory without following links) (`docker load`), failing after `limit`.
pub(crate) async fn load(
    docker: &Docker,
    path: &Path,
    file: &std::fs::File,
    limit: Duration,
) -> Result<(), DriverError> {
    let file = file
        .try_clone()
        .map(tokio::fs::File::from_std)
        .map_err(|e| DriverError::Internal(format!("load: cannot use {}: {e}", path.display())))?;
    // The daemon answers once it has read the whole tarball: let the request take as
    // long as the pull timeout allows.
    let docker = docker.clone().with_timeout(limit);
    let loading = async {
        let body = tokio_util::io::ReaderStream::new(file);
        let options = bollard::query_parameters::ImportImageOptions {
            quiet: true,
            ..Default::default()
        };
        let mut progress = docker.import_image_stream(options, body, None);
        while let Some(step) = progress.next().await {
            step?;
        }
        Ok::<(), bollard::errors::Error>(())
    };
    match tokio::time::timeout(limit, loading).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(docker_err(
            format!("loading image tarball {}", path.display()),
            e,
        )),
        Err(_) => Err(DriverError::Timeout(format!(
            "loading image tarball {} did not finish within the pull timeout ({})",
            path.display(),
            humantime::format_duration(limit)
        ))),
    }
}

/// Whether `image` is present.
pub(crate) async fn present(docker: &Docker, image: &str) -> Result<bool, DriverError> {
    match docker.inspect_image(image).await {
        Ok(_) => Ok(true),
        Err(e) if status_of(&e) == Some(404) => Ok(false),
        Err(e) => Err(docker_err(format!("inspecting image {image}"), e)),
    }
}

/// Remove the reference `image` unless a container was created from it. Removing a
/// reference that other tags share only untags it, and the daemon itself refuses to
/// delete an image a container still runs from. Best effort: problems are logged.
pub(crate) async fn collect(docker: &Docker, image: &str) {
    let options = bollard::query_parameters::ListContainersOptions {
        all: true,
        ..Default::default()
    };
    match docker.list_containers(Some(options)).await {
        Ok(list) => {
            if let Some(user) = list.iter().find(|c| c.image.as_deref() == Some(image)) {
                tracing::debug!(
                    "image {image} kept: container {} uses it",
                    user.id.as_deref().unwrap_or("?")
                );
                return;
            }
        }
        Err(e) => {
            tracing::warn!("image {image} kept: listing containers failed: {e}");
            return;
        }
    }
    let options = bollard::query_parameters::RemoveImageOptions {
        force: false,
        noprune: false,
        platforms: None,
    };
    match docker.remove_image(image, Some(options), None).await {
        Ok(_) => tracing::info!("image {image} removed: no container uses it"),
        Err(e) if status_of(&e) == Some(404) => {}
        // In use by a container created meanwhile.
        Err(e) if status_of(&e) == Some(409) => tracing::debug!("image {image} kept: {e}"),
        Err(e) => tracing::warn!("removing image {image}: {e}"),
    }
}
