"""What jobs record and show: MLflow runs (a parent per job, a child per unit), evaluated runs on disk (TREC runs,
programs), console progress and the engines' logs, and the stages of composite jobs.
"""
